//! Experiment only: the floor component (a fixed 200 with the same JSON as
//! bench/floor-app) as a WASIp3 `wasi:http/service` (WASI 0.3.0).
use wasip3::http::types::{ErrorCode, Fields, Request, Response};
use wasip3::{wit_bindgen, wit_future, wit_stream};

wasip3::http::service::export!(Floor);

struct Floor;

const BODY: &[u8] = br#"{"success":true,"data":{"status":"ok"}}"#;

impl wasip3::exports::http::handler::Guest for Floor {
    async fn handle(_request: Request) -> Result<Response, ErrorCode> {
        let headers = Fields::from_list(&[
            ("content-type".to_string(), b"application/json".to_vec()),
            (
                "content-length".to_string(),
                BODY.len().to_string().into_bytes(),
            ),
        ])
        .map_err(|_| ErrorCode::InternalError(None))?;
        let (mut body_tx, body_rx) = wit_stream::new();
        let (body_result_tx, body_result_rx) = wit_future::new(|| Ok(None));
        let (response, _done) = Response::new(headers, Some(body_rx), body_result_rx);
        drop(body_result_tx);
        wit_bindgen::spawn(async move {
            let _ = body_tx.write_all(BODY.to_vec()).await;
        });
        Ok(response)
    }
}
