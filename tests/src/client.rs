//! A deliberately small HTTP/1.1 client over `TcpStream`, so tests control
//! every byte they send (malformed bodies, odd headers) and read exactly what
//! the host answered.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// A response as received.
#[derive(Debug, Clone)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Headers (names lower-cased).
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Resp {
    /// First value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
    /// All values of a header.
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    /// The body as JSON (Null when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    /// `data` of a success envelope; panics with the body otherwise.
    pub fn data(&self) -> Value {
        let v = self.json();
        assert_eq!(
            v["success"],
            Value::Bool(true),
            "expected success, got {} {v}",
            self.status
        );
        v["data"].clone()
    }
    /// Asserts the failure envelope.
    pub fn assert_error(&self, status: u16, message: &str) {
        let v = self.json();
        assert_eq!(self.status, status, "body: {v}");
        assert_eq!(v, serde_json::json!({ "success": false, "error": message }));
    }
}

/// A client for one base URL (`127.0.0.1:port`).
#[derive(Debug, Clone)]
pub struct Client {
    /// `127.0.0.1:port`.
    pub addr: String,
}

impl Client {
    /// A client for `port` on 127.0.0.1.
    pub fn new(port: u16) -> Self {
        Client {
            addr: format!("127.0.0.1:{port}"),
        }
    }

    /// Sends one request; `Err` when the connection failed.
    pub fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Resp> {
        let mut s = TcpStream::connect(&self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.set_write_timeout(Some(Duration::from_secs(60)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        parse(&raw).ok_or_else(|| {
            std::io::Error::other(format!(
                "unparsable response: {:?}",
                String::from_utf8_lossy(&raw)
            ))
        })
    }

    /// Sends one request; panics when the connection fails.
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        self.try_send(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `GET {path}` with optional bearer token.
    pub fn get(&self, path: &str, token: Option<&str>) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut h: Vec<(&str, &str)> = vec![];
        if let Some(a) = &auth {
            h.push(("Authorization", a));
        }
        self.send("GET", path, &h, b"")
    }

    /// `POST {path}` with a JSON body and optional bearer token.
    pub fn post(&self, path: &str, body: &Value, token: Option<&str>) -> Resp {
        self.post_from(path, body, token, &[])
    }

    /// `POST` with extra headers.
    pub fn post_from(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
        extra: &[(&str, &str)],
    ) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut h: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            h.push(("Authorization", a));
        }
        h.extend_from_slice(extra);
        self.send("POST", path, &h, body.to_string().as_bytes())
    }

    /// `DELETE {path}` with a bearer token.
    pub fn delete(&self, path: &str, token: &str) -> Resp {
        let auth = format!("Bearer {token}");
        self.send("DELETE", path, &[("Authorization", &auth)], b"")
    }
}

fn parse(raw: &[u8]) -> Option<Resp> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(Resp {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(
            std::str::from_utf8(&data[..line_end])
                .ok()?
                .split(';')
                .next()?
                .trim(),
            16,
        )
        .ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}
