//! The Spin glue: read the request, call [`crate::respond`] with the SMTP
//! transport, write the answer.

use futures::{SinkExt, StreamExt};
use spin_sdk::http::{Fields, IncomingRequest, OutgoingResponse, ResponseOutparam};
use spin_sdk::http_component;
use tfa_smtp::relay::{answer_failed, MAX_REQUEST_BYTES};
use tfa_smtp::Stamp;

#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    let method = req.method().to_string();
    let path = req.path_with_query().unwrap_or_else(|| "/".to_string());
    let answer = match read_body(req).await {
        Ok(body) => crate::respond(&method, &path, &body, |r| {
            crate::smtp::send(&r.message, r.extra_ca_pem.as_deref(), r.address, &stamp())
        }),
        Err(why) => crate::Answer {
            status: 400,
            headers: Vec::new(),
            body: answer_failed(&why),
        },
    };
    if answer.status != 200 {
        eprintln!(
            "tfa-mailer: {} {path}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
    }
    send(out, answer).await;
}

/// The request body, at most [`MAX_REQUEST_BYTES`].
async fn read_body(req: IncomingRequest) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut stream = req.into_body_stream();
    while let Some(chunk) = stream.next().await {
        let bytes = chunk.map_err(|e| format!("could not read the request body: {e}"))?;
        body.extend_from_slice(&bytes);
        if body.len() > MAX_REQUEST_BYTES {
            return Err(format!("request body over {MAX_REQUEST_BYTES} bytes"));
        }
    }
    Ok(body)
}

/// The time and random bytes the SMTP client needs for one message.
#[allow(clippy::disallowed_methods)] // the mailer reads the clock for the Date header
fn stamp() -> Stamp {
    let unix_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut random = [0u8; 32];
    let bytes = wasi::random::random::get_random_bytes(32);
    let n = bytes.len().min(32);
    random[..n].copy_from_slice(&bytes[..n]);
    Stamp { unix_secs, random }
}

/// Writes the answer and finishes its body.
async fn send(out: ResponseOutparam, answer: crate::Answer) {
    let mut fields: Vec<(String, Vec<u8>)> = vec![
        ("content-type".into(), b"application/json".to_vec()),
        (
            "content-length".into(),
            answer.body.len().to_string().into_bytes(),
        ),
    ];
    fields.extend(
        answer
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())),
    );
    // Fixed, valid header names and values.
    let headers = Fields::from_list(&fields).unwrap_or_else(|_| Fields::new());
    let outgoing = OutgoingResponse::new(headers);
    if outgoing.set_status_code(answer.status).is_err() {
        let _ = outgoing.set_status_code(500);
    }
    let mut sink = outgoing.take_body();
    out.set(outgoing);
    if let Err(e) = sink.send(answer.body).await {
        eprintln!("tfa-mailer: could not write the answer: {e}");
    }
    drop(sink);
}
