//! Just enough HTTP/1.1 response parsing for `/healthz` and `/metrics`: status, and the
//! body whether sent with a length, chunked, or until close. `httparse` does the parsing.

use std::io;

use httparse::Status;

const MAX_HEADERS: usize = 64;

/// Parses a whole response (read until the server closed) into status code and body.
pub(crate) fn parse_response(raw: &[u8]) -> io::Result<(u16, String)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response
        .parse(raw)
        .map_err(|err| invalid(format!("bad response head: {err}")))?
    {
        Status::Complete(len) => len,
        Status::Partial => return Err(invalid("response ended inside its head".to_owned())),
    };
    let status = response
        .code
        .ok_or_else(|| invalid("response has no status code".to_owned()))?;
    let rest = &raw[head_len..];
    let body = if is_chunked(response.headers) {
        dechunk(rest)?
    } else if let Some(len) = content_length(response.headers)? {
        rest.get(..len)
            .ok_or_else(|| invalid(format!("body shorter than its Content-Length {len}")))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn header<'a>(headers: &'a [httparse::Header<'_>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

fn is_chunked(headers: &[httparse::Header<'_>]) -> bool {
    header(headers, "transfer-encoding").is_some_and(|value| {
        String::from_utf8_lossy(value)
            .to_ascii_lowercase()
            .contains("chunked")
    })
}

fn content_length(headers: &[httparse::Header<'_>]) -> io::Result<Option<usize>> {
    let Some(value) = header(headers, "content-length") else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value);
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| invalid(format!("bad Content-Length {text:?}")))
}

/// Joins the chunks of a chunked body.
fn dechunk(mut rest: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let (start, size) = match httparse::parse_chunk_size(rest) {
            Ok(Status::Complete(found)) => found,
            Ok(Status::Partial) => return Err(invalid("chunked body ended inside a chunk size".to_owned())),
            Err(_) => return Err(invalid("bad chunk size".to_owned())),
        };
        if size == 0 {
            return Ok(body);
        }
        let end = usize::try_from(size)
            .ok()
            .and_then(|size| start.checked_add(size));
        let chunk = end
            .and_then(|end| rest.get(start..end))
            .ok_or_else(|| invalid("chunk cut short".to_owned()))?;
        body.extend_from_slice(chunk);
        let after = &rest[start + chunk.len()..];
        rest = after
            .strip_prefix(b"\r\n")
            .ok_or_else(|| invalid("chunk not followed by CRLF".to_owned()))?;
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_content_length() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(parse_response(raw).unwrap(), (200, "hello".to_owned()));
    }

    #[test]
    fn a_chunked_body() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nnot \r\n5\r\nready\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap(), (503, "not ready".to_owned()));
    }

    #[test]
    fn a_body_until_close() {
        let raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n# HELP x\nx 1\n";
        assert_eq!(parse_response(raw).unwrap(), (200, "# HELP x\nx 1\n".to_owned()));
    }

    #[test]
    fn broken_responses_are_invalid_data() {
        let broken: [&[u8]; 5] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc",
            b"garbage\r\n\r\n",
        ];
        for raw in broken {
            let err = parse_response(raw).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidData,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}
