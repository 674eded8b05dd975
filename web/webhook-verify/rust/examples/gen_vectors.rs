//! Prints the known-signature vectors the JS tests use:
//! `cargo run -q -p webhook-verify-wasm --example gen_vectors > web/webhook-verify/test/vectors.json`

#[path = "../tests/support/vectors.rs"]
mod vectors;

fn main() {
    print!("{}", vectors::vectors_json());
}
