//! The Spin manifest (`SPIN_MANIFEST`, default `./spin.toml`), read and
//! parsed once at start: each component's `allowed_outbound_hosts`
//! ([`crate::outbound::from_manifest`]) and `environment`
//! ([`Manifest::environment`]) come from it.

use std::path::{Path, PathBuf};

/// A parsed manifest and the file it came from (for messages).
pub struct Manifest {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its TOML.
    pub doc: toml::Table,
}

impl Manifest {
    /// Reads and parses the manifest at `path`.
    pub fn read(path: &Path) -> Result<Manifest, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let doc =
            toml::from_str(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
        Ok(Manifest {
            path: path.to_path_buf(),
            doc,
        })
    }

    /// `[component.<id>]`, if the manifest has it.
    pub fn component(&self, id: &str) -> Option<&toml::Value> {
        self.doc.get("component").and_then(|c| c.get(id))
    }

    /// The `environment` of the component `id`
    /// (`[component.<id>] environment = { NAME = "value" }`): that
    /// component's WASI environment variables, as `spin up` gives them.
    /// Values are taken as written (Spin expands no templates there); a
    /// value that is not a string is an error, as it is for Spin. Empty when
    /// the component has no `environment`.
    pub fn environment(&self, id: &str) -> Result<Vec<(String, String)>, String> {
        let Some(env) = self.component(id).and_then(|c| c.get("environment")) else {
            return Ok(Vec::new());
        };
        let path = self.path.display();
        let table = env
            .as_table()
            .ok_or_else(|| format!("{path}: environment of [component.{id}] is not a table"))?;
        table
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(v) => Ok((k.clone(), v.to_string())),
                None => Err(format!(
                    "{path}: environment {k} of [component.{id}] is not a string"
                )),
            })
            .collect()
    }
}
