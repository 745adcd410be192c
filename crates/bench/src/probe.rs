//! Data-plane probe (runs inside the client namespace): time to connect
//! (SYN → SYN/ACK) of new TCP connections to each target, targets
//! interleaved sample by sample in a shuffled order so that every target
//! sees the same machine load. Each socket is closed with a reset, so no
//! TIME_WAIT state piles up. Also the `serve` side: accept and close.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Latency percentiles of one target, in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Percentiles {
    /// 1st percentile.
    pub p01: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Connections that failed.
    pub failures: usize,
}

/// The value at quantile `q` of sorted samples (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

pub(crate) fn connect_once(addr: SocketAddr) -> Option<Duration> {
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).ok()?;
    sock.set_linger(Some(Duration::ZERO)).ok()?;
    let t0 = Instant::now();
    sock.connect_timeout(&SockAddr::from(addr), Duration::from_secs(1))
        .ok()?;
    Some(t0.elapsed())
}

/// `probe SAMPLES WARMUP label=ip:port …`: prints `label p01 p50 p99 failures`.
pub fn probe(args: &[String]) -> Result<(), String> {
    let samples: usize = args
        .first()
        .and_then(|s| s.parse().ok())
        .ok_or("probe: SAMPLES")?;
    let warmup: usize = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .ok_or("probe: WARMUP")?;
    let mut targets: Vec<(String, SocketAddr)> = Vec::new();
    for t in &args[2..] {
        let (label, addr) = t
            .split_once('=')
            .ok_or_else(|| format!("probe: bad target {t}"))?;
        targets.push((
            label.to_owned(),
            addr.parse().map_err(|e| format!("{addr}: {e}"))?,
        ));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut failures = vec![0usize; targets.len()];
    let mut order: Vec<usize> = (0..targets.len()).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..warmup + samples {
        // Fisher–Yates with a small xorshift: a new order every round.
        for i in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        for &t in &order {
            let r = connect_once(targets[t].1);
            if round < warmup {
                continue;
            }
            match r {
                Some(d) => times[t].push(d.as_secs_f64() * 1e6),
                None => failures[t] += 1,
            }
        }
    }
    for (i, (label, _)) in targets.iter().enumerate() {
        let mut v = std::mem::take(&mut times[i]);
        v.sort_by(f64::total_cmp);
        println!(
            "{label} {:.1} {:.1} {:.1} {}",
            quantile(&v, 0.01),
            quantile(&v, 0.50),
            quantile(&v, 0.99),
            failures[i]
        );
    }
    Ok(())
}

/// `serve ADDR PORT,PORT…`: accepts connections and closes them.
pub fn serve(args: &[String]) -> Result<(), String> {
    let addr: Ipv4Addr = args
        .first()
        .and_then(|a| a.parse().ok())
        .ok_or("serve: ADDR")?;
    let ports: Vec<u16> = args
        .get(1)
        .ok_or("serve: PORTS")?
        .split(',')
        .map(|p| p.parse().map_err(|e| format!("{p}: {e}")))
        .collect::<Result<_, _>>()?;
    let mut threads = Vec::new();
    for p in ports {
        let l = TcpListener::bind((addr, p)).map_err(|e| format!("bind {addr}:{p}: {e}"))?;
        threads.push(std::thread::spawn(move || for _ in l.incoming() {}));
    }
    println!("ready");
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// Parses the probe's output.
pub fn parse_probe(out: &str) -> Vec<(String, Percentiles)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [label, a, b, c, f] => Some((
                    label.to_string(),
                    Percentiles {
                        p01: a.parse().ok()?,
                        p50: b.parse().ok()?,
                        p99: c.parse().ok()?,
                        failures: f.parse().ok()?,
                    },
                )),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.01), 1.0);
        assert_eq!(quantile(&v, 0.50), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn reads_probe_output() {
        let p = parse_probe("floor 10.0 20.5 40.0 0\nlate 11.0 22.0 50.0 2\nnoise\n");
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].0, "late");
        assert_eq!(p[1].1.failures, 2);
    }
}
