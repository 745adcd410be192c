//! Reading HTTP answers taken off the wire by hand (a shell's
//! `/dev/tcp`, a bare socket): a chunked body is decoded.

/// The body of a chunked answer; `Err` if it is cut before its last
/// chunk or is not chunked encoding.
pub fn decode_chunked(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| format!("cut after {} bytes of the body", out.len()))?;
        let line = std::str::from_utf8(&rest[..eol]).map_err(|e| e.to_string())?;
        // A chunk's size may be followed by extensions (`;name=value`).
        let size = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size, 16).map_err(|e| format!("a chunk size {line:?}: {e}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err(format!("cut in a chunk, after {} bytes", out.len()));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Whether an answer's head says its body is chunked.
pub fn is_chunked(head: &str) -> bool {
    head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    })
}

/// A whole answer (head and body) as read off the wire, with a chunked
/// body decoded; a body cut before its end is kept as it came, followed
/// by a line saying so, which no check of a whole body matches.
pub fn unchunked(raw: &str) -> String {
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return raw.to_owned();
    };
    if !is_chunked(head) {
        return raw.to_owned();
    }
    match decode_chunked(body.as_bytes()) {
        Ok(b) => format!("{head}\r\n\r\n{}", String::from_utf8_lossy(&b)),
        Err(e) => format!("{raw}\n(the chunked body is broken: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded_and_cut_ones_are_refused() {
        let raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n";
        assert_eq!(
            unchunked(raw),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nhello, world"
        );
        assert!(decode_chunked(b"5\r\nhel").is_err());
        assert!(decode_chunked(b"5\r\nhello\r\n").is_err(), "no last chunk");
        let plain = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(unchunked(plain), plain);
        assert!(
            unchunked("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe")
                .contains("broken")
        );
    }
}
