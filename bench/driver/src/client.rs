//! A minimal blocking HTTP/1.1 keep-alive client for 127.0.0.1: enough for
//! the load driver (one connection per worker thread), with
//! `Content-Length` and chunked bodies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};

/// One keep-alive connection to `127.0.0.1:port`.
pub struct Conn {
    port: u16,
    stream: Option<BufReader<TcpStream>>,
}

/// Status and body of an answer.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl Conn {
    pub fn new(port: u16) -> Conn {
        Conn { port, stream: None }
    }

    fn stream(&mut self) -> anyhow::Result<&mut BufReader<TcpStream>> {
        if self.stream.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port))
                .with_context(|| format!("connect 127.0.0.1:{}", self.port))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            s.set_write_timeout(Some(Duration::from_secs(60)))?;
            self.stream = Some(BufReader::new(s));
        }
        self.stream.as_mut().ok_or_else(|| anyhow!("no stream"))
    }

    /// Sends one request and reads the whole answer. On any error the
    /// connection is dropped (the next call opens a new one).
    pub fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        bearer: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let r = self.call_inner(method, path, body, bearer);
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn call_inner(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        bearer: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let port = self.port;
        let mut req = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n");
        if let Some(t) = bearer {
            req.push_str(&format!("authorization: Bearer {t}\r\n"));
        }
        let body = body.unwrap_or("");
        if method != "GET" {
            req.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        let s = self.stream()?;
        s.get_mut().write_all(req.as_bytes())?;

        let mut line = String::new();
        if s.read_line(&mut line)? == 0 {
            bail!("connection closed");
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("bad status line {line:?}"))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        let mut close = false;
        loop {
            line.clear();
            if s.read_line(&mut line)? == 0 {
                bail!("connection closed in headers");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                match k.as_str() {
                    "content-length" => length = v.parse().ok(),
                    "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                    "connection" => close = v.eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                s.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| anyhow!("bad chunk size {line:?}"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    loop {
                        line.clear();
                        if s.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let start = body.len();
                body.resize(start + size, 0);
                s.read_exact(&mut body[start..])?;
                line.clear();
                s.read_line(&mut line)?;
            }
        } else if let Some(n) = length {
            body.resize(n, 0);
            s.read_exact(&mut body)?;
        } else {
            s.read_to_end(&mut body)?;
            close = true;
        }
        if close {
            self.stream = None;
        }
        Ok(Answer { status, body })
    }
}
