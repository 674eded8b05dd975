//! E-mail over SMTP from inside the mailer component: the transport that
//! drives the sans-I/O client of the `tfa-smtp` crate.
//!
//! # What it does
//! - Opens a TCP connection with `wasi:sockets` (the `wasi` crate's
//!   bindings): to the address the relay request gives (under Spin, the IP
//!   of the API's `email_outbound_host` variable), else to the message's
//!   host resolved with `wasi:sockets/ip-name-lookup` (an IP literal is used
//!   as is), trying each address in turn.
//! - Bounds every step: resolving, connecting, each read and each write
//!   waits at most [`STEP_TIMEOUT_NS`] (10 s), and the whole delivery at
//!   most [`SESSION_TIMEOUT_NS`] (30 s) (`wasi:io/poll` on the socket's pollable and a
//!   `wasi:clocks/monotonic-clock` timer).
//! - Runs TLS with `rustls` and the pure-Rust RustCrypto provider
//!   (`rustls-rustcrypto`), trusting the Mozilla roots of `webpki-roots`
//!   plus the certificates of the request's `extraCaPem` (`EMAIL_TLS_CA_PEM`)
//!   when set; the server name checked is the message's host. Implicit TLS
//!   (port 465) starts before the greeting; otherwise the client asks for
//!   STARTTLS when the server offers it.
//! - Drives the sans-I/O client (see the `tfa-smtp` crate docs) to the end and
//!   reports the result as a reason for the API's log.
//!
//! # What it does not do
//! No connection reuse, no retries, no certificate revocation checks.
//! Whether the component may connect at all is the host's decision:
//! `spin.toml` must allow the server's `tcp://IP:PORT` for this component
//! (variable `email_outbound_host`). Spin 4.x denies `ip-name-lookup` and
//! checks the connected address, so under Spin the server is always
//! reached by that IP; the message's host is then only the TLS server name.
//!
//! # How the mailer uses it
//! `component.rs` calls [`send`] with the relay request's message, extra CA
//! and address, and a [`Stamp`] (wall-clock seconds and 32 bytes from
//! `wasi:random`); [`send`] connects, runs the session, and returns `Ok(())`
//! once the server has accepted the message.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use tfa_smtp::{ClientOptions, EmailMessage, SmtpClient, SmtpTls, Stamp, Status};
use wasi::clocks::monotonic_clock;
use wasi::io::poll::{self, Pollable};
use wasi::io::streams::{InputStream, OutputStream, StreamError};
use wasi::sockets::network::{
    ErrorCode, IpAddress, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress, Ipv6SocketAddress,
    Network,
};
use wasi::sockets::{instance_network, ip_name_lookup, tcp::TcpSocket, tcp_create_socket};

/// The longest wait for any one step (resolve, connect, one read or write):
/// 10 s, in nanoseconds.
pub const STEP_TIMEOUT_NS: u64 = 10_000_000_000;

/// The longest a whole delivery may take: 30 s, in nanoseconds.
pub const SESSION_TIMEOUT_NS: u64 = 30_000_000_000;

/// At most this many resolved addresses are tried.
const MAX_ADDRESSES: usize = 4;

/// Sends one e-mail; `Ok(())` once the server accepted it, else why not.
pub fn send(
    message: &EmailMessage,
    extra_ca_pem: Option<&str>,
    address: Option<SocketAddr>,
    stamp: &Stamp,
) -> Result<(), String> {
    let target = format!("{}:{}", message.host, message.port);
    let fail = |what: String| format!("SMTP {target}: {what}");
    let mut client = SmtpClient::new(message, stamp, &ClientOptions::default())
        .map_err(|e| fail(e.to_string()))?;
    let config = tls_config(extra_ca_pem).map_err(fail)?;
    let deadline = monotonic_clock::now().saturating_add(SESSION_TIMEOUT_NS);
    let socket = match address {
        Some(a) => WasiTcp::connect_one(
            &instance_network::instance_network(),
            ip_address(a.ip()),
            a.port(),
            deadline,
        ),
        None => WasiTcp::connect(&message.host, message.port, deadline),
    }
    // The error names the step (`connect: …`, `resolve …: …`).
    .map_err(|e| fail(e.to_string()))?;
    let conn = match message.tls {
        SmtpTls::Implicit => Conn::Tls(Box::new(
            handshake(socket, &config, &message.host).map_err(fail)?,
        )),
        SmtpTls::StartTlsIfOffered => Conn::Plain(socket),
    };
    drive(&mut client, conn, &config, &message.host).map_err(fail)
}

/// The public roots plus the extra PEM certificates.
fn tls_config(extra_ca_pem: Option<&str>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(pem) = extra_ca_pem {
        let mut added = 0usize;
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("EMAIL_TLS_CA_PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("EMAIL_TLS_CA_PEM: {e}"))?;
            added = added.saturating_add(1);
        }
        if added == 0 {
            return Err("EMAIL_TLS_CA_PEM holds no certificate".into());
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(rustls_rustcrypto::provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn handshake(
    mut socket: WasiTcp,
    config: &Arc<ClientConfig>,
    host: &str,
) -> Result<StreamOwned<ClientConnection, WasiTcp>, String> {
    let fail = |what: String| format!("TLS: {what}");
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(bare.to_string()).map_err(|e| fail(e.to_string()))?;
    let mut tls = ClientConnection::new(config.clone(), name).map_err(|e| fail(e.to_string()))?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket)
            .map_err(|e| fail(format!("handshake failed: {e}")))?;
    }
    Ok(StreamOwned::new(tls, socket))
}

/// The connection, before and after TLS.
enum Conn {
    Plain(WasiTcp),
    Tls(Box<StreamOwned<ClientConnection, WasiTcp>>),
}

impl Conn {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.as_mut(),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The client's host loop (see `tfa_smtp`, "How a host drives it"): the
/// session's result, or why the connection failed.
fn drive(
    client: &mut SmtpClient,
    conn: Conn,
    config: &Arc<ClientConfig>,
    host: &str,
) -> Result<(), String> {
    let mut conn = Some(conn);
    let mut buf = vec![0u8; 16 * 1024];
    // Each turn reads, writes or upgrades once; a session needs a few dozen.
    for _ in 0..10_000 {
        let Some(c) = conn.as_mut() else {
            return Err("connection lost".into());
        };
        let mut written = Ok(());
        while let Some(out) = client.poll_output() {
            written = written.and_then(|()| c.io().write_all(&out));
        }
        let status = client.status();
        if let Err(e) = written.and_then(|()| c.io().flush()) {
            // Once the message is accepted, a failed QUIT does not matter.
            return match status {
                Status::Done(Ok(())) => Ok(()),
                _ => Err(format!("write: {e}")),
            };
        }
        match status {
            Status::Done(result) => {
                if let Conn::Tls(tls) = c {
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
                return result.map_err(|e| e.to_string());
            }
            Status::StartTls => {
                let Some(Conn::Plain(socket)) = conn.take() else {
                    return Err("STARTTLS asked for twice".into());
                };
                let tls = handshake(socket, config, host)?;
                conn = Some(Conn::Tls(Box::new(tls)));
                client.tls_established();
                continue;
            }
            Status::Running => {}
        }
        match c.io().read(&mut buf) {
            Ok(0) => client.handle_eof(),
            Ok(n) => client.handle_input(buf.get(..n).unwrap_or_default()),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    Err("the session did not finish".into())
}

// ------------------------------------------------------------ wasi:sockets

/// A connected TCP socket with blocking, deadline-bounded `Read`/`Write`.
/// Field order matters: the streams are children of the socket and must be
/// dropped first.
struct WasiTcp {
    input: InputStream,
    output: OutputStream,
    _socket: TcpSocket,
    deadline: u64,
}

fn io_err(kind: io::ErrorKind, what: impl Into<String>) -> io::Error {
    io::Error::new(kind, what.into())
}

fn sock_err(what: &str, e: ErrorCode) -> io::Error {
    io::Error::other(format!("{what}: {}", e.name()))
}

/// Waits until `pollable` is ready, at most [`STEP_TIMEOUT_NS`] and never
/// past `deadline` (monotonic nanoseconds).
fn wait(pollable: &Pollable, deadline: u64, what: &str) -> io::Result<()> {
    let now = monotonic_clock::now();
    let until = now.saturating_add(STEP_TIMEOUT_NS).min(deadline);
    if now >= until {
        return Err(io_err(
            io::ErrorKind::TimedOut,
            format!("{what}: timed out"),
        ));
    }
    let timer = monotonic_clock::subscribe_instant(until);
    let ready = poll::poll(&[pollable, &timer]);
    if ready.contains(&0) {
        Ok(())
    } else {
        Err(io_err(
            io::ErrorKind::TimedOut,
            format!("{what}: timed out"),
        ))
    }
}

impl WasiTcp {
    fn connect(host: &str, port: u16, deadline: u64) -> io::Result<WasiTcp> {
        let network = instance_network::instance_network();
        let addresses = resolve(&network, host, deadline)?;
        let mut last = io_err(io::ErrorKind::NotFound, format!("{host} has no address"));
        for address in addresses.into_iter().take(MAX_ADDRESSES) {
            match Self::connect_one(&network, address, port, deadline) {
                Ok(socket) => return Ok(socket),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn connect_one(
        network: &Network,
        address: IpAddress,
        port: u16,
        deadline: u64,
    ) -> io::Result<WasiTcp> {
        let (family, remote) = match address {
            IpAddress::Ipv4(a) => (
                IpAddressFamily::Ipv4,
                IpSocketAddress::Ipv4(Ipv4SocketAddress { port, address: a }),
            ),
            IpAddress::Ipv6(a) => (
                IpAddressFamily::Ipv6,
                IpSocketAddress::Ipv6(Ipv6SocketAddress {
                    port,
                    address: a,
                    flow_info: 0,
                    scope_id: 0,
                }),
            ),
        };
        let socket = tcp_create_socket::create_tcp_socket(family)
            .map_err(|e| sock_err("create socket", e))?;
        socket
            .start_connect(network, remote)
            .map_err(|e| sock_err("connect", e))?;
        loop {
            match socket.finish_connect() {
                Ok((input, output)) => {
                    return Ok(WasiTcp {
                        input,
                        output,
                        _socket: socket,
                        deadline,
                    })
                }
                Err(ErrorCode::WouldBlock) => {
                    let pollable = socket.subscribe();
                    wait(&pollable, deadline, "connect")?;
                }
                Err(e) => return Err(sock_err("connect", e)),
            }
        }
    }
}

/// `ip` in `wasi:sockets` form.
fn ip_address(ip: IpAddr) -> IpAddress {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            IpAddress::Ipv4((a, b, c, d))
        }
        IpAddr::V6(v6) => {
            let [a, b, c, d, e, f, g, h] = v6.segments();
            IpAddress::Ipv6((a, b, c, d, e, f, g, h))
        }
    }
}

/// The addresses of `host`: an IP literal as is, else `ip-name-lookup`.
fn resolve(network: &Network, host: &str, deadline: u64) -> io::Result<Vec<IpAddress>> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![ip_address(ip)]);
    }
    let stream = ip_name_lookup::resolve_addresses(network, bare)
        .map_err(|e| sock_err(&format!("resolve {bare}"), e))?;
    let mut found = Vec::new();
    loop {
        match stream.resolve_next_address() {
            Ok(Some(address)) => {
                if found.len() < 32 {
                    found.push(address);
                }
            }
            Ok(None) => break,
            Err(ErrorCode::WouldBlock) => {
                let pollable = stream.subscribe();
                wait(&pollable, deadline, "resolve")?;
            }
            Err(e) => return Err(sock_err(&format!("resolve {bare}"), e)),
        }
    }
    // IPv4 first: SMTP servers commonly listen on both, and hosts without
    // IPv6 routes fail slowly.
    found.sort_by_key(|a| matches!(a, IpAddress::Ipv6(_)));
    Ok(found)
}

fn stream_err(what: &str, e: StreamError) -> io::Error {
    match e {
        StreamError::Closed => io_err(io::ErrorKind::BrokenPipe, format!("{what}: closed")),
        StreamError::LastOperationFailed(e) => {
            io::Error::other(format!("{what}: {}", e.to_debug_string()))
        }
    }
}

impl Read for WasiTcp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.input.read(buf.len() as u64) {
                Ok(bytes) if !bytes.is_empty() => {
                    let n = bytes.len().min(buf.len());
                    buf[..n].copy_from_slice(&bytes[..n]);
                    return Ok(n);
                }
                Ok(_) => {
                    let pollable = self.input.subscribe();
                    wait(&pollable, self.deadline, "read")?;
                }
                Err(StreamError::Closed) => return Ok(0),
                Err(e) => return Err(stream_err("read", e)),
            }
        }
    }
}

impl Write for WasiTcp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let room = self
                .output
                .check_write()
                .map_err(|e| stream_err("write", e))?;
            if room == 0 {
                let pollable = self.output.subscribe();
                wait(&pollable, self.deadline, "write")?;
                continue;
            }
            let n = usize::try_from(room).unwrap_or(usize::MAX).min(buf.len());
            self.output
                .write(&buf[..n])
                .map_err(|e| stream_err("write", e))?;
            return Ok(n);
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.output.flush().map_err(|e| stream_err("flush", e))?;
        // The flush is complete once the stream accepts writes again.
        loop {
            let room = self
                .output
                .check_write()
                .map_err(|e| stream_err("flush", e))?;
            if room > 0 {
                return Ok(());
            }
            let pollable = self.output.subscribe();
            wait(&pollable, self.deadline, "flush")?;
        }
    }
}
