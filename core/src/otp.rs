//! SMS and e-mail one-time codes (placeholder).
/// State carried across a delivery.
#[derive(Debug)]
pub struct PendingSend;
