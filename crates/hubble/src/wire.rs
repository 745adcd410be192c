//! Protocol buffers' wire format, the part Hubble's messages use: varints,
//! fixed 64-bit doubles and length-delimited fields (strings, bytes,
//! embedded messages). Written by hand from the format's specification:
//! the messages are few and fixed, and no code generator or runtime is
//! needed for them.
//!
//! Encoding follows proto3: a scalar field equal to its default (0,
//! false, an empty string) is not written; an embedded message is written
//! whenever it is present, even empty.

/// A value's wire type (the low three bits of its key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WireType {
    Varint = 0,
    Fixed64 = 1,
    Len = 2,
}

/// Why a message cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("the message ends inside a field")]
    Truncated,
    /// A varint longer than ten bytes.
    #[error("a varint is longer than 64 bits")]
    VarintTooLong,
    /// A wire type protocol buffers do not define (or the deprecated
    /// groups).
    #[error("field {field} has wire type {wire_type}, which is not supported")]
    WireType {
        /// The field number.
        field: u32,
        /// The wire type.
        wire_type: u8,
    },
    /// Field number 0, which no message has.
    #[error("a field numbered 0")]
    FieldZero,
    /// A field has another wire type than its declaration's.
    #[error("field {0} has the wrong wire type for its declaration")]
    Mismatch(u32),
    /// A string field is not UTF-8.
    #[error("field {0} is not UTF-8")]
    Utf8(u32),
}

/// Builds a message.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty message.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, t: WireType) {
        self.varint(u64::from(field) << 3 | t as u64);
    }

    /// A `uint64`, `uint32` or enum field (not written if 0).
    pub fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, WireType::Varint);
            self.varint(v);
        }
    }

    /// An `int32` or `int64` field (not written if 0): a negative value
    /// takes ten bytes, as the format wants.
    pub fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    /// A `bool` field (not written if false).
    pub fn bool(&mut self, field: u32, v: bool) {
        self.uint(field, u64::from(v));
    }

    /// A `double` field (not written if 0).
    pub fn double(&mut self, field: u32, v: f64) {
        if v != 0.0 {
            self.key(field, WireType::Fixed64);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// A `string` field (not written if empty).
    pub fn string(&mut self, field: u32, v: &str) {
        if !v.is_empty() {
            self.bytes(field, v.as_bytes());
        }
    }

    /// Every value of a `repeated string` field, empty ones included.
    pub fn strings<'a>(&mut self, field: u32, vs: impl IntoIterator<Item = &'a str>) {
        for v in vs {
            self.bytes(field, v.as_bytes());
        }
    }

    /// A `bytes` field, written even if empty.
    pub fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, WireType::Len);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// An embedded message, written even if empty.
    pub fn message(&mut self, field: u32, build: impl FnOnce(&mut Writer)) {
        let mut inner = Writer::new();
        build(&mut inner);
        self.bytes(field, &inner.buf);
    }
}

/// One field as read: its number and value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Field<'a> {
    /// The field number.
    pub number: u32,
    value: Value<'a>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Field<'a> {
    /// A varint field's value (`uint64`, `uint32`, `bool`, an enum).
    pub fn uint(&self) -> Result<u64, DecodeError> {
        match self.value {
            Value::Varint(v) => Ok(v),
            _ => Err(DecodeError::Mismatch(self.number)),
        }
    }

    /// A `bool` field's value.
    pub fn bool(&self) -> Result<bool, DecodeError> {
        Ok(self.uint()? != 0)
    }

    /// An `int64` field's value (`int32` values are sign-extended).
    pub fn int(&self) -> Result<i64, DecodeError> {
        Ok(self.uint()? as i64)
    }

    /// A `double` field's value.
    pub fn double(&self) -> Result<f64, DecodeError> {
        match self.value {
            Value::Fixed64(v) => Ok(f64::from_bits(v)),
            _ => Err(DecodeError::Mismatch(self.number)),
        }
    }

    /// A length-delimited field's bytes (`bytes`, an embedded message).
    pub fn bytes(&self) -> Result<&'a [u8], DecodeError> {
        match self.value {
            Value::Len(b) => Ok(b),
            _ => Err(DecodeError::Mismatch(self.number)),
        }
    }

    /// A `string` field's value.
    pub fn string(&self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| DecodeError::Utf8(self.number))
    }

    /// A `repeated` varint field's values, packed (proto3's default) or
    /// not: appended to `out`.
    pub fn uints(&self, out: &mut Vec<u64>) -> Result<(), DecodeError> {
        match self.value {
            Value::Varint(v) => out.push(v),
            Value::Len(mut b) => {
                while !b.is_empty() {
                    out.push(read_varint(&mut b)?);
                }
            }
            _ => return Err(DecodeError::Mismatch(self.number)),
        }
        Ok(())
    }
}

fn read_varint(b: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b.split_first().ok_or(DecodeError::Truncated)?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Ok(v);
        }
    }
    Err(DecodeError::VarintTooLong)
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if b.len() < n {
        return Err(DecodeError::Truncated);
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

/// The fields of a message, in the order written; fields a reader does
/// not know are skipped by the reader, as the format wants.
pub fn fields(mut b: &[u8]) -> impl Iterator<Item = Result<Field<'_>, DecodeError>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if b.is_empty() || failed {
            return None;
        }
        let next = (|| {
            let key = read_varint(&mut b)?;
            let number = u32::try_from(key >> 3).map_err(|_| DecodeError::FieldZero)?;
            if number == 0 {
                return Err(DecodeError::FieldZero);
            }
            let wire_type = (key & 7) as u8;
            let value = match wire_type {
                0 => Value::Varint(read_varint(&mut b)?),
                1 => {
                    let raw = take(&mut b, 8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(raw);
                    Value::Fixed64(u64::from_le_bytes(a))
                }
                2 => {
                    let n = read_varint(&mut b)?;
                    let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
                    Value::Len(take(&mut b, n)?)
                }
                5 => {
                    let raw = take(&mut b, 4)?;
                    let mut a = [0u8; 4];
                    a.copy_from_slice(raw);
                    Value::Fixed32(u32::from_le_bytes(a))
                }
                _ => {
                    return Err(DecodeError::WireType {
                        field: number,
                        wire_type,
                    });
                }
            };
            Ok(Field { number, value })
        })();
        failed = next.is_err();
        Some(next)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of the format's specification: 150 in field 1 is
    /// `08 96 01`; "testing" in field 2 is `12 07 74 65 73 74 69 6e 67`.
    #[test]
    fn the_specifications_examples() {
        let mut w = Writer::new();
        w.uint(1, 150);
        assert_eq!(w.finish(), [0x08, 0x96, 0x01]);
        let mut w = Writer::new();
        w.string(2, "testing");
        assert_eq!(
            w.finish(),
            [0x12, 0x07, 0x74, 0x65, 0x73, 0x74, 0x69, 0x6e, 0x67]
        );
    }

    #[test]
    fn what_is_written_reads_back_and_defaults_are_left_out() {
        let mut w = Writer::new();
        w.uint(1, 0);
        w.bool(3, false);
        w.string(4, "");
        w.uint(1000, 7);
        w.int(2, -1);
        w.double(9, 1.5);
        w.message(5, |m| m.string(1, "ns"));
        w.message(6, |_| {});
        w.strings(7, ["a", ""]);
        let buf = w.finish();
        let read: Vec<Field<'_>> = fields(&buf).collect::<Result<_, _>>().unwrap();
        let numbers: Vec<u32> = read.iter().map(|f| f.number).collect();
        assert_eq!(numbers, [1000, 2, 9, 5, 6, 7, 7]);
        assert_eq!(read[0].uint().unwrap(), 7);
        assert_eq!(read[1].int().unwrap(), -1);
        assert_eq!(read[2].double().unwrap(), 1.5);
        let inner: Vec<Field<'_>> = fields(read[3].bytes().unwrap())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(inner[0].string().unwrap(), "ns");
        assert!(read[4].bytes().unwrap().is_empty());
        assert_eq!(read[6].string().unwrap(), "");
        assert_eq!(read[0].string(), Err(DecodeError::Mismatch(1000)));
    }

    #[test]
    fn packed_and_unpacked_repeated_varints_read_alike() {
        let mut out = Vec::new();
        let packed = [0x2a, 0x03, 0x01, 0x96, 0x01];
        for f in fields(&packed) {
            f.unwrap().uints(&mut out).unwrap();
        }
        let mut w = Writer::new();
        w.uint(5, 2);
        let unpacked = w.finish();
        for f in fields(&unpacked) {
            f.unwrap().uints(&mut out).unwrap();
        }
        assert_eq!(out, [1, 150, 2]);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let cases: [(&[u8], DecodeError); 4] = [
            (&[0x08], DecodeError::Truncated),
            (&[0x12, 0x05, 0x61], DecodeError::Truncated),
            (&[0x00, 0x01], DecodeError::FieldZero),
            (
                &[0x0b],
                DecodeError::WireType {
                    field: 1,
                    wire_type: 3,
                },
            ),
        ];
        for (bytes, want) in cases {
            let got: Result<Vec<_>, _> = fields(bytes).collect();
            assert_eq!(got.unwrap_err(), want, "{bytes:?}");
        }
        let long = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        let got: Result<Vec<_>, _> = fields(&long).collect();
        assert_eq!(got.unwrap_err(), DecodeError::VarintTooLong);
    }
}
