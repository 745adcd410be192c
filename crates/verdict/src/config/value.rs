//! Values as Go and kube-proxy read and write them: `time.Duration`
//! (`1m30s`), `strconv.ParseBool`, integers, resource quantities, and the
//! flag forms of lists and maps. Each kind reads the command line's text
//! and the file's JSON into one JSON form, so the effective configuration
//! is a single document whatever the source.

use std::time::Duration;

use serde_json::Value;

/// What a setting holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Str,
    /// `true` or `false` (flags take Go's `strconv.ParseBool` spellings).
    Bool,
    /// A 32-bit integer.
    Int32,
    /// A non-negative 32-bit integer (klog's verbosity).
    Uint32,
    /// A 32-bit float.
    Float,
    /// A Go duration, kept in Go's canonical spelling (`30s`, `1h0m0s`).
    Duration,
    /// component-base's `TimeOrMetaDuration`: a duration, or in the file
    /// also a number of nanoseconds (`logging.flushFrequency`).
    NanosOrDuration,
    /// A list of strings; a flag takes it comma-separated, and a repeated
    /// flag adds to it (pflag's `StringSlice`).
    List,
    /// Feature gates: `Name=true,Other=false` on the command line; a
    /// repeated flag adds to them.
    Gates,
    /// klog's vmodule: `pattern=N,...` on the command line; in the file a
    /// list of `{filePattern, verbosity}`.
    VModule,
    /// A resource quantity or a number (`0`, `64Ki`, `1M`).
    Quantity,
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration` (which accepts a sign, fractions and the
/// units ns, us, µs, ms, s, m, h; a bare number only for 0). Negative
/// durations parse, as in Go; validation rejects them where they matter.
pub fn parse_duration(s: &str) -> Option<(bool, Duration)> {
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some((false, Duration::ZERO));
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        nanos = nanos.checked_add(whole.checked_mul(scale)?)?;
        // The fraction, to nanosecond precision as Go keeps it.
        let mut frac_nanos: u128 = 0;
        let mut place = scale;
        for d in fraction.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            frac_nanos += u128::from(d - b'0') * place;
        }
        nanos = nanos.checked_add(frac_nanos)?;
    }
    // Go's Duration is an int64 of nanoseconds.
    if nanos > i64::MAX as u128 {
        return None;
    }
    let d = Duration::from_nanos(u64::try_from(nanos).ok()?);
    Some((negative && !d.is_zero(), d))
}

/// Go's `time.Duration.String()`: `0s`, `250ms`, `1.5s`, `1m30s`, `24h0m0s`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let fixed = |value: u128, unit: u128, suffix: &str| {
        let whole = value / unit;
        let frac = value % unit;
        if frac == 0 {
            format!("{whole}{suffix}")
        } else {
            let width = unit.ilog10() as usize;
            let digits = format!("{frac:0width$}");
            format!("{whole}.{}{suffix}", digits.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return fixed(nanos, 1_000, "µs");
    }
    if nanos < 1_000_000_000 {
        return fixed(nanos, 1_000_000, "ms");
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = (nanos / 60_000_000_000) % 60;
    let seconds = fixed(nanos % 60_000_000_000, 1_000_000_000, "s");
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}")
    } else {
        seconds
    }
}

/// A resource quantity (`0`, `1024`, `64Ki`, `1M`, `1.5Gi`) as a number
/// of units.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some(n * scale)
}

impl Kind {
    /// The JSON form of a flag's text, merged into what earlier
    /// occurrences of the same flag gave (`previous`): lists and gates
    /// accumulate, everything else is replaced (the last one wins).
    pub fn read_flag(self, text: &str, previous: Option<&Value>) -> Result<Value, String> {
        Ok(match self {
            Kind::Str => Value::String(text.to_owned()),
            Kind::Bool => Value::Bool(
                parse_bool(text).ok_or_else(|| format!("{text:?} is not true or false"))?,
            ),
            Kind::Int32 => Value::from(
                text.trim()
                    .parse::<i32>()
                    .map_err(|_| format!("{text:?} is not a 32-bit whole number"))?,
            ),
            Kind::Uint32 => Value::from(
                text.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{text:?} is not a whole number, 0 or more"))?,
            ),
            Kind::Float => {
                let f: f32 = text
                    .trim()
                    .parse()
                    .map_err(|_| format!("{text:?} is not a number"))?;
                serde_json::Number::from_f64(f64::from(f))
                    .map(Value::Number)
                    .ok_or_else(|| format!("{text:?} is not a finite number"))?
            }
            Kind::Duration | Kind::NanosOrDuration => Value::String(duration_text(text)?),
            Kind::List => {
                let mut list = match previous {
                    Some(Value::Array(a)) => a.clone(),
                    _ => Vec::new(),
                };
                list.extend(
                    text.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| Value::String(s.to_owned())),
                );
                Value::Array(list)
            }
            Kind::Gates => {
                let mut gates = match previous {
                    Some(Value::Object(m)) => m.clone(),
                    _ => serde_json::Map::new(),
                };
                for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let (name, value) = pair
                        .split_once('=')
                        .ok_or_else(|| format!("missing bool value for {pair}"))?;
                    let on = parse_bool(value.trim())
                        .ok_or_else(|| format!("invalid value of {pair}: not true or false"))?;
                    gates.insert(name.trim().to_owned(), Value::Bool(on));
                }
                Value::Object(gates)
            }
            Kind::VModule => {
                let mut list = match previous {
                    Some(Value::Array(a)) => a.clone(),
                    _ => Vec::new(),
                };
                for item in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let (pattern, level) = item
                        .split_once('=')
                        .ok_or_else(|| format!("{item:?} is not pattern=N"))?;
                    let level: u32 = level
                        .parse()
                        .map_err(|_| format!("{item:?}: {level:?} is not a verbosity"))?;
                    if pattern.is_empty() {
                        return Err(format!("{item:?} has an empty pattern"));
                    }
                    list.push(serde_json::json!({"filePattern": pattern, "verbosity": level}));
                }
                Value::Array(list)
            }
            Kind::Quantity => {
                parse_quantity(text).ok_or_else(|| format!("{text:?} is not a quantity"))?;
                Value::String(text.trim().to_owned())
            }
        })
    }

    /// Checks a value of the file (not null), as the v1alpha1 decoder
    /// would, and returns it in canonical form (durations in Go's
    /// spelling). A wrong type is an error in strict and lenient decoding
    /// alike.
    pub fn read_file(self, v: &Value) -> Result<Value, String> {
        let wrong = |what: &str| format!("must be {what}, not {v}");
        match self {
            Kind::Str => match v {
                Value::String(_) => Ok(v.clone()),
                _ => Err(wrong("a string")),
            },
            Kind::Bool => match v {
                Value::Bool(_) => Ok(v.clone()),
                _ => Err(wrong("true or false")),
            },
            Kind::Int32 => match v.as_i64() {
                Some(n) if i32::try_from(n).is_ok() => Ok(v.clone()),
                _ => Err(wrong("a 32-bit whole number")),
            },
            Kind::Uint32 => match v.as_u64() {
                Some(n) if u32::try_from(n).is_ok() => Ok(v.clone()),
                _ => Err(wrong("a whole number, 0 or more")),
            },
            // A float32, as the flag reads it: `5` and `5.0` are one value.
            Kind::Float => match v.as_f64() {
                Some(f) => serde_json::Number::from_f64(f64::from(f as f32))
                    .map(Value::Number)
                    .ok_or_else(|| wrong("a finite number")),
                None => Err(wrong("a number")),
            },
            Kind::Duration => match v {
                Value::String(s) => Ok(Value::String(duration_text(s)?)),
                _ => Err(wrong("a duration string (like 30s)")),
            },
            Kind::NanosOrDuration => match v {
                Value::String(s) => Ok(Value::String(duration_text(s)?)),
                Value::Number(n) => n
                    .as_u64()
                    .map(|ns| Value::String(format_duration(Duration::from_nanos(ns))))
                    .ok_or_else(|| wrong("a duration (like 5s) or nanoseconds")),
                _ => Err(wrong("a duration (like 5s) or nanoseconds")),
            },
            Kind::List => match v {
                Value::Array(a) if a.iter().all(Value::is_string) => Ok(v.clone()),
                _ => Err(wrong("a list of strings")),
            },
            Kind::Gates => match v {
                Value::Object(m) if m.values().all(Value::is_boolean) => Ok(v.clone()),
                _ => Err(wrong("a map of feature names to true or false")),
            },
            Kind::VModule => {
                let ok = v.as_array().is_some_and(|a| {
                    a.iter().all(|i| {
                        i.get("filePattern").is_some_and(Value::is_string)
                            && i.get("verbosity").is_some_and(|n| n.as_u64().is_some())
                            && i.as_object().is_some_and(|o| o.len() == 2)
                    })
                });
                if ok {
                    Ok(v.clone())
                } else {
                    Err(wrong("a list of {filePattern, verbosity}"))
                }
            }
            Kind::Quantity => match v {
                Value::Number(_) => Ok(v.clone()),
                Value::String(s) if parse_quantity(s).is_some() => Ok(v.clone()),
                _ => Err(wrong("a quantity (like 0 or 64Ki)")),
            },
        }
    }

    /// Whether `v` is this kind's zero value (Go's defaulting replaces
    /// zero values of non-pointer fields).
    pub fn is_zero(self, v: &Value) -> bool {
        match v {
            Value::Null => true,
            Value::String(s) => match self {
                Kind::Duration | Kind::NanosOrDuration => {
                    parse_duration(s).is_some_and(|(_, d)| d.is_zero())
                }
                _ => s.is_empty(),
            },
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::Array(a) => a.is_empty(),
            Value::Object(m) => m.is_empty(),
        }
    }
}

/// A duration's text in Go's spelling, or why it is not one.
fn duration_text(s: &str) -> Result<String, String> {
    let (negative, d) =
        parse_duration(s).ok_or_else(|| format!("{s:?} is not a duration (like 1s, 30s, 1m)"))?;
    let text = format_duration(d);
    Ok(if negative { format!("-{text}") } else { text })
}

/// A duration of the effective configuration (always canonical text).
pub fn duration_of(v: &Value) -> Option<(bool, Duration)> {
    v.as_str().and_then(parse_duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        let d = |s| parse_duration(s).map(|(neg, d)| (neg, d.as_nanos()));
        assert_eq!(d("1s"), Some((false, 1_000_000_000)));
        assert_eq!(d("1m30s"), Some((false, 90_000_000_000)));
        assert_eq!(d("250ms"), Some((false, 250_000_000)));
        assert_eq!(d("1.5h"), Some((false, 5_400_000_000_000)));
        assert_eq!(d("0"), Some((false, 0)));
        assert_eq!(d("-0s"), Some((false, 0)));
        assert_eq!(d("-2s"), Some((true, 2_000_000_000)));
        assert_eq!(d("1µs"), Some((false, 1_000)));
        assert_eq!(d(".5s"), Some((false, 500_000_000)));
        for bad in ["", "s", "10", "1x", "1..2s", "-", "9999999999h"] {
            assert_eq!(d(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_print_like_go() {
        let f = |s| parse_duration(s).map(|(_, d)| format_duration(d)).unwrap();
        assert_eq!(f("0"), "0s");
        assert_eq!(f("30s"), "30s");
        assert_eq!(f("90s"), "1m30s");
        assert_eq!(f("1h"), "1h0m0s");
        assert_eq!(f("24h"), "24h0m0s");
        assert_eq!(f("15m"), "15m0s");
        assert_eq!(f("250ms"), "250ms");
        assert_eq!(f("1.5s"), "1.5s");
        assert_eq!(f("1500us"), "1.5ms");
        assert_eq!(f("42ns"), "42ns");
        assert_eq!(f("1h0m0.25s"), "1h0m0.25s");
    }

    #[test]
    fn flags_accumulate_lists_and_gates_and_replace_the_rest() {
        let one = Kind::List.read_flag("a,b", None).unwrap();
        let two = Kind::List.read_flag("c", Some(&one)).unwrap();
        assert_eq!(two, serde_json::json!(["a", "b", "c"]));
        let g = Kind::Gates.read_flag("A=true, B=false", None).unwrap();
        let g = Kind::Gates.read_flag("B=true", Some(&g)).unwrap();
        assert_eq!(g, serde_json::json!({"A": true, "B": true}));
        assert!(Kind::Gates.read_flag("A", None).is_err());
        assert!(Kind::Gates.read_flag("A=maybe", None).is_err());
        assert_eq!(
            Kind::Bool.read_flag("True", None).unwrap(),
            Value::Bool(true)
        );
        assert!(Kind::Bool.read_flag("yes", None).is_err());
        assert_eq!(
            Kind::Duration.read_flag("90s", None).unwrap(),
            Value::String("1m30s".into())
        );
        let vm = Kind::VModule.read_flag("proxier=4,sync*=2", None).unwrap();
        assert_eq!(vm[1]["filePattern"], "sync*");
        assert!(Kind::VModule.read_flag("proxier", None).is_err());
    }

    #[test]
    fn file_values_are_type_checked() {
        assert!(Kind::Duration.read_file(&Value::from(30)).is_err());
        assert_eq!(
            Kind::Duration.read_file(&Value::from("60s")).unwrap(),
            Value::from("1m0s")
        );
        assert!(Kind::Int32.read_file(&Value::from(1u64 << 40)).is_err());
        assert!(Kind::List.read_file(&serde_json::json!(["a", 1])).is_err());
        assert!(Kind::Quantity.read_file(&Value::from("64Ki")).is_ok());
        assert!(Kind::Quantity.read_file(&Value::from("lots")).is_err());
        assert!(Kind::Duration.is_zero(&Value::from("0s")));
        assert!(!Kind::Duration.is_zero(&Value::from("1s")));
    }
}
