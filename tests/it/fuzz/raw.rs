//! Raw requests over TCP that hyper must refuse by itself, or that break off.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

/// Raw requests hyper must refuse by itself or that break off: each gets a 4xx.
pub(super) fn raw_request(rng: &mut StdRng) -> (&'static str, Vec<u8>, bool) {
    let push = br#"{"stream":"fz-0","payload":"x","delay_ms":0}"#;
    let (kind, text, half_close): (&'static str, Vec<u8>, bool) = match rng.random_range(0..13) {
        0 => ("garbage-request-line", b"GARBAGE\r\n\r\n".to_vec(), false),
        1 => {
            let big = "a".repeat(rng.random_range(500_000..800_000));
            ("huge-header", format!("GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").into_bytes(), false)
        }
        2 => ("content-length-not-a-number", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}".to_vec(), false),
        3 => {
            let mut t = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n".to_vec();
            t.extend_from_slice(&push[..20]);
            ("content-length-longer-than-body", t, true)
        }
        4 => {
            let mut t = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n".to_vec();
            t.extend_from_slice(push);
            ("content-length-shorter-than-body", t, false)
        }
        5 => ("content-length-and-chunked", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), false),
        6 => ("bad-chunk-size", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(), false),
        7 => ("control-character-in-header", b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n".to_vec(), false),
        8 => {
            let long = "a".repeat(rng.random_range(500_000..800_000));
            ("huge-path", format!("GET /v1/messages/{long} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(), false)
        }
        9 => ("content-length-overflow", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551616\r\n\r\n{}".to_vec(), false),
        10 => ("content-length-negative", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}".to_vec(), false),
        11 => ("nul-in-path", b"GET /v1/\x00stats HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), false),
        _ => ("two-content-lengths", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec(), false),
    };
    (kind, text, half_close)
}

/// Sends raw bytes and returns the status and body of the first answer (None: no
/// answer).
pub(super) fn send_raw(
    addr: std::net::SocketAddr,
    bytes: &[u8],
    half_close: bool,
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // A server may answer and close before reading everything: a failed write is fine.
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_more = |s: &mut TcpStream, got: &mut Vec<u8>, buf: &mut [u8]| match s.read(buf) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            got.extend_from_slice(&buf[..n]);
            true
        }
    };
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !read_more(&mut s, &mut got, &mut buf) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while got.len() < head_end + length {
        if !read_more(&mut s, &mut got, &mut buf) {
            break;
        }
    }
    // Only this answer's body: a request that breaks off may be answered twice,
    // and the second answer can come in the same read.
    let end = (head_end + length).min(got.len());
    Some((status, got[head_end..end].to_vec()))
}
