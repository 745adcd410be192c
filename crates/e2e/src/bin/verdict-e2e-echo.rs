//! The test bed's traffic tool, run inside network namespaces.
//!
//! `verdict-e2e-echo serve --addr IP [--addr IP]… [--tcp PORT]… [--udp PORT]…`
//! listens on every address and port and answers each connection (or
//! datagram) with `LOCALIP:LOCALPORT PEERIP PEERPORT`: who answered and
//! which source address it saw. It prints `ready` once everything is bound.
//!
//! `verdict-e2e-echo connect --proto tcp|udp --src IP --dst IP --port P [--timeout-ms N]`
//! makes one connection from `IP` and prints one line:
//! `OK <answer> <local port>`, `REFUSED`, `TIMEOUT` or `ERROR <what>`.
//!
//! `verdict-e2e-echo send --src IP --dst IP --port P (--sockets N --packets M | --seconds S)`
//! sends UDP datagrams and reads no answer: M from each of N sockets, or,
//! for S seconds as fast as it can, one from each new socket (a new source
//! port, so a new connection, per datagram). It prints
//! `SENT <datagrams> <sockets>`.
//!
//! `verdict-e2e-echo hold-log-group GROUP` binds that nfnetlink_log group
//! (as a logging daemon would), prints `ready`, and holds it until killed.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("connect") => connect(&args[1..]),
        Some("send") => send(&args[1..]),
        Some("hold-log-group") => hold_log_group(&args[1..]),
        _ => Err("usage: verdict-e2e-echo serve|connect|send|hold-log-group …".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verdict-e2e-echo: {e}");
            ExitCode::from(2)
        }
    }
}

/// Values of a repeated `--flag VALUE` option.
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

fn one<'a>(args: &'a [String], flag: &str) -> Result<&'a str, String> {
    values(args, flag)
        .first()
        .copied()
        .ok_or_else(|| format!("missing {flag}"))
}

fn serve(args: &[String]) -> Result<(), String> {
    let addrs: Vec<IpAddr> = values(args, "--addr")
        .iter()
        .map(|a| a.parse().map_err(|e| format!("--addr {a}: {e}")))
        .collect::<Result<_, _>>()?;
    let port = |p: &str| p.parse::<u16>().map_err(|e| format!("port {p}: {e}"));
    let tcp: Vec<u16> = values(args, "--tcp")
        .into_iter()
        .map(port)
        .collect::<Result<_, _>>()?;
    let udp: Vec<u16> = values(args, "--udp")
        .into_iter()
        .map(port)
        .collect::<Result<_, _>>()?;
    let mut handles = Vec::new();
    for addr in &addrs {
        for p in &tcp {
            let l =
                TcpListener::bind((*addr, *p)).map_err(|e| format!("bind tcp {addr}:{p}: {e}"))?;
            handles.push(thread::spawn(move || {
                for mut s in l.incoming().flatten() {
                    if let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) {
                        let _ = writeln!(s, "{} {} {}", show(local), peer.ip(), peer.port());
                    }
                }
            }));
        }
        for p in &udp {
            let sock =
                UdpSocket::bind((*addr, *p)).map_err(|e| format!("bind udp {addr}:{p}: {e}"))?;
            handles.push(thread::spawn(move || {
                let mut buf = [0u8; 512];
                while let Ok((_, peer)) = sock.recv_from(&mut buf) {
                    if let Ok(local) = sock.local_addr() {
                        let msg = format!("{} {} {}\n", show(local), peer.ip(), peer.port());
                        let _ = sock.send_to(msg.as_bytes(), peer);
                    }
                }
            }));
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// `10.0.0.1:80` or `[fd00::1]:80` (the tracer's spelling).
fn show(a: SocketAddr) -> String {
    a.to_string()
}

fn connect(args: &[String]) -> Result<(), String> {
    let proto = one(args, "--proto")?;
    let src: IpAddr = one(args, "--src")?
        .parse()
        .map_err(|e| format!("--src: {e}"))?;
    let dst: IpAddr = one(args, "--dst")?
        .parse()
        .map_err(|e| format!("--dst: {e}"))?;
    let port: u16 = one(args, "--port")?
        .parse()
        .map_err(|e| format!("--port: {e}"))?;
    let timeout = Duration::from_millis(
        one(args, "--timeout-ms")
            .unwrap_or("1000")
            .parse()
            .map_err(|e| format!("--timeout-ms: {e}"))?,
    );
    let domain = if dst.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let (ty, p) = match proto {
        "tcp" => (Type::STREAM, Protocol::TCP),
        "udp" => (Type::DGRAM, Protocol::UDP),
        other => return Err(format!("unsupported protocol {other}")),
    };
    let sock = Socket::new(domain, ty, Some(p)).map_err(|e| format!("socket: {e}"))?;
    // A fixed source port keeps a UDP "flow" in one conntrack entry across runs.
    let sport: u16 = match one(args, "--sport") {
        Ok(p) => p.parse().map_err(|e| format!("--sport: {e}"))?,
        Err(_) => 0,
    };
    if sport != 0 {
        sock.set_reuse_address(true)
            .map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    }
    sock.bind(&SockAddr::from(SocketAddr::new(src, sport)))
        .map_err(|e| format!("bind {src}: {e}"))?;
    let target = SockAddr::from(SocketAddr::new(dst, port));
    let line = match proto {
        "tcp" => match sock.connect_timeout(&target, timeout) {
            Ok(()) => read_answer(sock, timeout),
            Err(e) => classify(&e),
        },
        _ => {
            let run = || -> std::io::Result<()> {
                sock.connect(&target)?;
                sock.set_read_timeout(Some(timeout))?;
                sock.send(b"ping")?;
                Ok(())
            };
            match run() {
                Ok(()) => read_answer(sock, timeout),
                Err(e) => classify(&e),
            }
        }
    };
    println!("{line}");
    Ok(())
}

fn send(args: &[String]) -> Result<(), String> {
    let addr = |flag: &str| -> Result<IpAddr, String> {
        one(args, flag)?.parse().map_err(|e| format!("{flag}: {e}"))
    };
    let number = |flag: &str| -> Result<Option<u64>, String> {
        match one(args, flag) {
            Ok(v) => v.parse().map(Some).map_err(|e| format!("{flag}: {e}")),
            Err(_) => Ok(None),
        }
    };
    let (src, dst) = (addr("--src")?, addr("--dst")?);
    let port: u16 = one(args, "--port")?
        .parse()
        .map_err(|e| format!("--port: {e}"))?;
    let target = SocketAddr::new(dst, port);
    let (mut datagrams, mut sockets) = (0u64, 0u64);
    // Answers (ICMP errors) are not read: a send may fail with the error
    // an earlier datagram drew, and the next one is sent all the same.
    let mut one_socket = |packets: u64| -> Result<(), String> {
        let sock =
            UdpSocket::bind(SocketAddr::new(src, 0)).map_err(|e| format!("bind {src}: {e}"))?;
        sockets += 1;
        for _ in 0..packets {
            let _ = sock.send_to(b"ping", target);
            datagrams += 1;
        }
        Ok(())
    };
    match (
        number("--seconds")?,
        number("--sockets")?,
        number("--packets")?,
    ) {
        (Some(secs), None, None) => {
            let until = std::time::Instant::now() + Duration::from_secs(secs);
            while std::time::Instant::now() < until {
                for _ in 0..64 {
                    one_socket(1)?;
                }
            }
        }
        (None, Some(n), Some(m)) => {
            for _ in 0..n {
                one_socket(m)?;
            }
        }
        _ => return Err("give --seconds S, or --sockets N and --packets M".into()),
    }
    println!("SENT {datagrams} {sockets}");
    Ok(())
}

fn read_answer(sock: Socket, timeout: Duration) -> String {
    let local_port = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .unwrap_or(0);
    if let Err(e) = sock.set_read_timeout(Some(timeout)) {
        return format!("ERROR {e}");
    }
    let mut r = BufReader::new(std::io::Read::take(SocketReader(sock), 512));
    let mut answer = String::new();
    match r.read_line(&mut answer) {
        Ok(n) if n > 0 => format!("OK {} {local_port}", answer.trim()),
        Ok(_) => "ERROR closed without an answer".into(),
        Err(e) => classify(&e),
    }
}

/// Reads a connected socket (TCP stream or connected UDP socket).
struct SocketReader(Socket);

impl std::io::Read for SocketReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self.0, buf)
    }
}

fn classify(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::ConnectionRefused => "REFUSED".into(),
        ErrorKind::TimedOut | ErrorKind::WouldBlock => "TIMEOUT".into(),
        _ => format!("ERROR {e}"),
    }
}

/// Binds an nfnetlink_log group and holds it until killed.
fn hold_log_group(args: &[String]) -> Result<(), String> {
    let group: u16 = args
        .first()
        .and_then(|g| g.parse().ok())
        .ok_or("hold-log-group GROUP")?;
    let _held = verdict_nft::flows::FlowMonitor::open(Some(group), false)
        .map_err(|e| format!("binding nfnetlink_log group {group}: {e}"))?;
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}
