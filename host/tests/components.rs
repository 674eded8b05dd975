//! The application's two components as this host loads them: what each
//! imports is what its part of `spin.toml` grants, so the API component
//! (which holds the signing secrets and the store) cannot open a socket,
//! and the mailer (which opens the SMTP connection) cannot read the store
//! or the settings. Both link against the host's imports.

// The shared support module's bounded waits read the clock, as the other
// host tests allow.
#![allow(clippy::disallowed_methods)]

mod support;

use std::path::Path;

use tfa_host::runtime;
use wasmtime::component::Component;

/// The interface names (`wasi:sockets/tcp@0.2.x`, ...) a component imports.
fn imports(engine: &wasmtime::Engine, wasm: &Path) -> Vec<String> {
    let component =
        Component::from_file(engine, wasm).unwrap_or_else(|e| panic!("{}: {e:?}", wasm.display()));
    let linker = runtime::linker(engine).unwrap();
    runtime::pre_instantiate(&linker, &component)
        .unwrap_or_else(|e| panic!("{} does not link: {e:?}", wasm.display()));
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

fn any(names: &[String], prefix: &str) -> bool {
    names.iter().any(|n| n.starts_with(prefix))
}

#[test]
fn each_component_imports_only_what_it_is_granted() {
    let engine = runtime::engine(false).unwrap();
    let api = imports(&engine, &support::real_component());
    let mailer = imports(&engine, &support::real_mailer());

    // The API: the store, the settings (all at once through wasi:config,
    // one by one as a fallback), outbound HTTP; no socket at all.
    for needed in [
        "fermyon:spin/key-value",
        "fermyon:spin/variables",
        "wasi:config/store",
        "wasi:keyvalue/atomics",
        "wasi:http/outgoing-handler",
    ] {
        assert!(any(&api, needed), "the API imports {needed}: {api:?}");
    }
    for denied in [
        "wasi:sockets/tcp",
        "wasi:sockets/tcp-create-socket",
        "wasi:sockets/ip-name-lookup",
        "wasi:sockets/udp",
    ] {
        assert!(!any(&api, denied), "the API imports {denied}: {api:?}");
    }

    // The mailer: TCP and name lookups for SMTP; no store, no settings,
    // no outbound HTTP.
    for needed in ["wasi:sockets/tcp", "wasi:sockets/ip-name-lookup"] {
        assert!(
            any(&mailer, needed),
            "the mailer imports {needed}: {mailer:?}"
        );
    }
    for denied in [
        "fermyon:spin/key-value",
        "fermyon:spin/variables",
        "wasi:config/",
        "wasi:keyvalue/",
        "wasi:http/outgoing-handler",
    ] {
        assert!(
            !any(&mailer, denied),
            "the mailer imports {denied}: {mailer:?}"
        );
    }
}
