//! The entry point a host drives.

use crate::audit;
use crate::config::Config;
use crate::context::{Ctx, Outcome};
use crate::error::ApiError;
use crate::housekeeping;
use crate::http::{Request, Response};
use crate::outbox::{Completion, DeliveryError, Effect, Pending, Reply, Step};
use crate::ports::Env;
use crate::{otp, router, web, webhooks};

/// The whole API, driven by a host. Holds only settings: every call borrows
/// its I/O through an [`Env`], so one `Service` may serve concurrent
/// requests, and a new one per request (as in a Spin component) costs
/// nothing but the settings.
pub struct Service {
    config: Config,
}

impl Service {
    /// Builds the service from parsed settings.
    pub fn new(config: Config) -> Self {
        Service { config }
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles one request. Never panics on any input; a store failure
    /// becomes 503 `Service unavailable`.
    pub fn handle(&self, env: &mut Env, req: &Request) -> Step {
        let mut ctx = Ctx::new(&self.config, env, req);
        let result = router::dispatch(&mut ctx);
        self.conclude(ctx, result)
    }

    /// Continues a request after its host tried the delivery it asked for.
    pub fn resume(
        &self,
        env: &mut Env,
        pending: Pending,
        result: Result<(), DeliveryError>,
    ) -> Step {
        let s = *pending.0;
        let mut ctx = Ctx::resumed(&self.config, env, &s.req, s.headers, s.effects, s.ip, s.ua);
        let out = otp::finish_send(&mut ctx, s.send, result);
        self.conclude(ctx, out)
    }

    /// Runs what follows a response: persists audit records, turns events
    /// into webhook deliveries, picks up retries that came due, and sweeps
    /// expired records. The host logs the returned lines and attempts the
    /// returned webhook calls.
    pub fn complete(&self, env: &mut Env, effects: Vec<Effect>) -> Completion {
        let mut out = Completion::default();
        let mut maintenance = false;
        for effect in effects {
            match effect {
                Effect::Audit(record) => {
                    if let Some((user_id, event, data)) = webhooks::event_of(&record) {
                        match webhooks::fan_out(env, &user_id, event, data) {
                            Ok(calls) => out.webhooks.extend(calls),
                            Err(_) => out
                                .log
                                .push(format!("webhooks: event {event} could not be queued")),
                        }
                    }
                    if audit::persist(env, &record).is_err() {
                        out.log.push(format!(
                            "audit record {} ({}) could not be stored",
                            record.id, record.action
                        ));
                    }
                }
                Effect::Log(line) => out.log.push(line),
                Effect::Webhook(call) => out.webhooks.push(call),
                Effect::Maintenance => maintenance = true,
            }
        }
        // One read (`sched:next`) tells whether either queue has a bucket
        // due; only then are their pointers read and their buckets done.
        if maintenance && housekeeping::anything_due(env) {
            let (retries, result) = webhooks::due(env);
            out.webhooks.extend(retries);
            let retried = result.is_ok();
            if !retried {
                out.log
                    .push("webhooks: retry queue unavailable".to_string());
            }
            let swept = housekeeping::tick(env).is_ok();
            if !swept {
                out.log.push("housekeeping: store unavailable".to_string());
            }
            if retried && swept {
                housekeeping::note_next_due(env, &[&webhooks::RETRY_QUEUE]);
            }
        }
        out
    }

    /// Records the outcome of a webhook call from [`Service::complete`]:
    /// `Ok(status)` for any HTTP answer, `Err(reason)` when none came (refused,
    /// timed out). Returns lines for the log.
    pub fn webhook_result(
        &self,
        env: &mut Env,
        delivery_id: &str,
        result: Result<u16, String>,
    ) -> Vec<String> {
        webhooks::record_result(env, delivery_id, result).unwrap_or_else(|_| {
            vec![format!(
                "webhook delivery {delivery_id}: result not recorded (store unavailable)"
            )]
        })
    }

    /// The 503 a host answers when it cannot build a service at all (bad
    /// production settings): the envelope with the security headers.
    pub fn unavailable_response() -> Response {
        let mut resp = web::error_response(&ApiError::Unavailable);
        resp.set_header("X-Content-Type-Options", "nosniff");
        resp.set_header("X-Frame-Options", "DENY");
        resp.set_header("Cache-Control", "no-store");
        resp
    }

    fn conclude(&self, ctx: Ctx, result: Result<Outcome, ApiError>) -> Step {
        let mut ctx = ctx;
        let response = match result {
            Ok(Outcome::Done(resp)) => resp,
            Ok(Outcome::Deliver(delivery, send)) => {
                return Step::Deliver(delivery, Pending(Box::new(ctx.suspend(*send))));
            }
            Err(e) => {
                if matches!(e, ApiError::Internal | ApiError::Unavailable) {
                    ctx.log(format!(
                        "{} {} failed: {:?}",
                        ctx.req.method,
                        ctx.req.path_only(),
                        e
                    ));
                }
                web::error_response(&e)
            }
        };
        Step::Respond(self.finish(ctx, response))
    }

    fn finish(&self, ctx: Ctx, mut response: Response) -> Reply {
        for (k, v) in ctx.headers {
            if k.eq_ignore_ascii_case("set-cookie") {
                response.add_header(&k, v);
            } else if response.header_value(&k).is_none() {
                response.set_header(&k, v);
            }
        }
        web::security_headers(&mut response, &self.config);
        web::cors_headers(&mut response, ctx.req, &self.config);
        Reply {
            response,
            effects: ctx.effects,
        }
    }
}
