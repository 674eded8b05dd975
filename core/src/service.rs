//! The entry point a host drives.

use crate::audit;
use crate::config::Config;
use crate::context::{Ctx, Outcome};
use crate::error::ApiError;
use crate::housekeeping;
use crate::http::{Request, Response};
use crate::outbox::{DeliveryError, Effect, Pending, Reply, Step};
use crate::ports::Env;
use crate::{otp, router, web};

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

    /// Runs what follows a response: persists audit records and sweeps
    /// expired records. Returns the lines for the operator's log (from
    /// [`Effect::Log`] and from anything that failed here).
    pub fn complete(&self, env: &mut Env, effects: Vec<Effect>) -> Vec<String> {
        let mut log = Vec::new();
        for effect in effects {
            match effect {
                Effect::Audit(record) => {
                    if audit::persist(env, &record).is_err() {
                        log.push(format!(
                            "audit record {} ({}) could not be stored",
                            record.id, record.action
                        ));
                    }
                }
                Effect::Log(line) => log.push(line),
            }
        }
        if housekeeping::tick(env).is_err() {
            log.push("housekeeping: store unavailable".to_string());
        }
        log
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
