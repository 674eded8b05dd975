//! The driver a host calls: [`Service`] and the [`Step`] it returns. It sits
//! above the three folders: it builds a [`Ctx`] (plumbing), enters the
//! endpoints only through the door of [`crate::api`] (`dispatch`,
//! `after_response`, `webhook_result`), and speaks the contract's types.

use crate::api;
use crate::contract::config::Config;
use crate::contract::error::ApiError;
use crate::contract::http::{Request, Response};
use crate::contract::outbox::{Completion, Delivery, DeliveryError, Effect, Reply};
use crate::contract::ports::Env;
use crate::plumbing::context::{Ctx, Outcome, Suspended};
use crate::plumbing::web;

/// The outcome of one step of handling a request.
#[derive(Debug)]
pub enum Step {
    /// Write this reply; then pass its effects to [`crate::Service::complete`].
    Respond(Reply),
    /// Perform this delivery, then call [`crate::Service::resume`] with the
    /// pending state and the delivery's result.
    Deliver(Delivery, Pending),
}

/// State carried across a [`Delivery`]; opaque to hosts.
#[derive(Debug)]
pub struct Pending(pub(crate) Box<Suspended>);

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
        let result = api::dispatch(&mut ctx);
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
        ctx.user_id = s.user_id;
        let out = s.send.finish(&mut ctx, result);
        self.conclude(ctx, out)
    }

    /// Runs what follows a response: persists audit records, turns events
    /// into webhook deliveries, picks up retries that came due, and sweeps
    /// expired records. The host logs the returned lines and attempts the
    /// returned webhook calls.
    pub fn complete(&self, env: &mut Env, effects: Vec<Effect>) -> Completion {
        api::after_response(env, effects)
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
        api::webhook_result(env, delivery_id, result)
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
                return Step::Deliver(delivery, Pending(Box::new(ctx.suspend(send))));
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
            user_id: ctx.user_id,
        }
    }
}
