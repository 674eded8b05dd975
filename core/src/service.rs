//! The entry point (placeholder until the router lands).
use crate::config::Config;
use crate::http::{Request, Response};
use crate::outbox::{DeliveryError, Effect, Pending, Reply, Step};
use crate::ports::Env;

/// The whole API, driven by a host.
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
    /// Handles one request.
    pub fn handle(&self, _env: &mut Env, _req: &Request) -> Step {
        Step::Respond(Reply {
            response: Response {
                status: 404,
                headers: vec![("content-type".into(), "application/json".into())],
                body: br#"{"success":false,"error":"Resource not found"}"#.to_vec(),
            },
            effects: vec![],
        })
    }
    /// Continues after a delivery.
    pub fn resume(&self, env: &mut Env, _p: Pending, _r: Result<(), DeliveryError>) -> Step {
        self.handle(env, &Request::new("GET", "/"))
    }
    /// Runs the after-response effects that need only the store.
    pub fn complete(&self, _env: &mut Env, _effects: Vec<Effect>) {}
}
