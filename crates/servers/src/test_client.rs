//! A minimal HTTP/1.1 client for tests: enough to check status, headers and body, and to
//! send requests no well-behaved client would.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) struct Reply {
    pub status: u16,
    headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path).await
}

pub(crate) async fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    request_with(addr, method, path, &[]).await
}

/// `method path` with extra header lines (`name: value`, written as given).
pub(crate) async fn request_with(addr: SocketAddr, method: &str, path: &str, headers: &[&str]) -> Reply {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    raw(addr, request.as_bytes()).await.expect("the server answered")
}

/// Sends `request` as is; `None` when the server closed the connection without an answer.
pub(crate) async fn raw(addr: SocketAddr, request: &[u8]) -> Option<Reply> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before reading all of an oversized request.
    let _ = stream.write_all(request).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: body.to_string(),
    })
}
