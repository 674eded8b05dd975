//! One VM running the filter: instantiation, the root context, and the
//! calls a test drives (configuration, streams, callouts, ticks).

use super::imports::{define_env, define_wasi};
use super::*;

/// Options of a new plugin.
#[derive(Clone, Default)]
pub struct PluginOptions {
    /// Shared data, to share with other plugins (workers); fresh if `None`.
    pub shared: Option<SharedStore>,
    /// Clusters `proxy_http_call` accepts; any if `None`.
    pub known_clusters: Option<Vec<String>>,
    /// Initial clock, Unix seconds.
    pub now_secs: u64,
    /// VM configuration.
    pub vm_config: Vec<u8>,
}

/// One VM running the filter, with its root context.
pub struct Plugin {
    store: Store<HostState>,
    instance: Instance,
    root_id: u32,
    next_id: u32,
}

impl Plugin {
    /// Instantiates the module, runs `_initialize`, creates the root
    /// context and starts the VM (not yet configured).
    pub fn start(module: &FilterModule, opts: PluginOptions) -> Result<Plugin> {
        let mut linker = Linker::new(&module.engine);
        let mut defined: Vec<String> = define_env(&mut linker)?
            .into_iter()
            .map(|n| format!("env.{n}"))
            .collect();
        defined.extend(
            define_wasi(&mut linker)?
                .into_iter()
                .map(|n| format!("wasi_snapshot_preview1.{n}")),
        );
        for import in module.module.imports() {
            let full = format!("{}.{}", import.module(), import.name());
            if defined.contains(&full) {
                continue;
            }
            let ExternType::Func(ty) = import.ty() else {
                wasmtime::bail!("import {full} is not a function");
            };
            let code = if import.module() == "env" {
                status::UNIMPLEMENTED
            } else {
                WASI_ENOSYS
            };
            let results: Vec<ValType> = ty.results().collect();
            let name = full.clone();
            linker.func_new(
                import.module(),
                import.name(),
                ty,
                move |mut c, _params, out| {
                    c.data_mut().logs.push((
                        level::CRITICAL,
                        format!("host: unimplemented import {name} called"),
                    ));
                    if let (Some(slot), Some(ValType::I32)) = (out.first_mut(), results.first()) {
                        *slot = Val::I32(code);
                    }
                    Ok(())
                },
            )?;
            defined.push(full);
        }
        let state = HostState {
            now_ns: opts.now_secs.saturating_mul(1_000_000_000),
            vm_config: opts.vm_config,
            plugin_config: Vec::new(),
            effective: 0,
            streams: HashMap::new(),
            call_response_headers: Vec::new(),
            call_response_trailers: Vec::new(),
            call_response_body: Vec::new(),
            calls: Vec::new(),
            next_token: 0,
            known_clusters: opts.known_clusters,
            shared: opts.shared.unwrap_or_default(),
            properties: HashMap::new(),
            metrics: Vec::new(),
            logs: Vec::new(),
            stdout: Vec::new(),
            random_state: 0x5eed,
        };
        let mut store = Store::new(&module.engine, state);
        let instance = linker.instantiate(&mut store, &module.module)?;
        if let Some(init) = instance.get_func(&mut store, "_initialize") {
            init.typed::<(), ()>(&store)?.call(&mut store, ())?;
        }
        let mut plugin = Plugin {
            store,
            instance,
            root_id: 1,
            next_id: 2,
        };
        plugin.store.data_mut().effective = plugin.root_id;
        plugin.call_void2("proxy_on_context_create", plugin.root_id as i32, 0)?;
        let size = plugin.store.data().vm_config.len() as i32;
        let ok = plugin
            .instance
            .get_typed_func::<(i32, i32), i32>(&mut plugin.store, "proxy_on_vm_start")?
            .call(&mut plugin.store, (plugin.root_id as i32, size))?;
        if ok == 0 {
            wasmtime::bail!("proxy_on_vm_start returned false");
        }
        Ok(plugin)
    }

    /// Starts a VM and configures it; `Ok(None)` when the configuration is
    /// refused (`proxy_on_configure` returned false).
    pub fn with_config(module: &FilterModule, opts: PluginOptions, config: &str) -> Result<Plugin> {
        let mut p = Plugin::start(module, opts)?;
        if !p.configure(config)? {
            wasmtime::bail!("configuration refused: {:?}", p.logs());
        }
        Ok(p)
    }

    fn call_void2(&mut self, name: &str, a: i32, b: i32) -> Result<()> {
        self.instance
            .get_typed_func::<(i32, i32), ()>(&mut self.store, name)?
            .call(&mut self.store, (a, b))
    }

    /// Calls `proxy_on_configure` with `config`; its answer.
    pub fn configure(&mut self, config: &str) -> Result<bool> {
        self.store.data_mut().plugin_config = config.as_bytes().to_vec();
        self.store.data_mut().effective = self.root_id;
        let ok = self
            .instance
            .get_typed_func::<(i32, i32), i32>(&mut self.store, "proxy_on_configure")?
            .call(&mut self.store, (self.root_id as i32, config.len() as i32))?;
        Ok(ok != 0)
    }

    /// Sets the clock, Unix seconds.
    pub fn set_time_secs(&mut self, secs: u64) {
        self.store.data_mut().now_ns = secs.saturating_mul(1_000_000_000);
    }

    /// Sets the clock, Unix milliseconds.
    pub fn set_time_ms(&mut self, ms: u64) {
        self.store.data_mut().now_ns = ms.saturating_mul(1_000_000);
    }

    /// The clock, Unix milliseconds.
    pub fn time_ms(&self) -> u64 {
        self.store.data().now_ns / 1_000_000
    }

    /// Sets a property (path parts joined by NUL, as the ABI serialises them).
    pub fn set_property(&mut self, path: &[&str], value: &[u8]) {
        self.store
            .data_mut()
            .properties
            .insert(path.join("\0").into_bytes(), value.to_vec());
    }

    /// A property, as set by the host or the module.
    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.store
            .data()
            .properties
            .get(path.join("\0").as_bytes())
            .cloned()
    }

    /// Log lines so far, `(level, message)`.
    pub fn logs(&self) -> Vec<(u32, String)> {
        self.store.data().logs.clone()
    }

    /// What the module wrote to stdout/stderr through WASI.
    pub fn stdout(&self) -> Vec<u8> {
        self.store.data().stdout.clone()
    }

    /// Value of metric `name`, if defined.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.store
            .data()
            .metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Every metric.
    pub fn metrics(&self) -> Vec<Metric> {
        self.store.data().metrics.clone()
    }

    /// The shared data of this VM.
    pub fn shared(&self) -> SharedStore {
        self.store.data().shared.clone()
    }

    /// Callouts not answered yet.
    pub fn pending_calls(&self) -> Vec<HttpCall> {
        self.store.data().calls.clone()
    }

    /// Sends a request's headers through the filter (`proxy_on_context_create`
    /// then `proxy_on_request_headers`). Header names are lower-cased.
    pub fn request(&mut self, headers: &[(&str, &str)]) -> Result<(u32, Outcome)> {
        let id = self.next_id;
        self.next_id += 1;
        let stream = Stream {
            request_headers: headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
                .collect(),
            ..Stream::default()
        };
        let n = stream.request_headers.len() as i32;
        self.store.data_mut().streams.insert(id, stream);
        self.store.data_mut().effective = self.root_id;
        self.call_void2("proxy_on_context_create", id as i32, self.root_id as i32)?;
        self.store.data_mut().effective = id;
        let action = self
            .instance
            .get_typed_func::<(i32, i32, i32), i32>(&mut self.store, "proxy_on_request_headers")?
            .call(&mut self.store, (id as i32, n, 1))?;
        let outcome = self.outcome(id, action == 0)?;
        Ok((id, outcome))
    }

    /// Answers callout `call` with `status` (`None`: no response at all, as
    /// on a timeout or connection failure), `headers` and `body`.
    pub fn answer(
        &mut self,
        call: &HttpCall,
        status: Option<u16>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Outcome> {
        let pos = self
            .store
            .data()
            .calls
            .iter()
            .position(|c| c.token == call.token)
            .ok_or_else(|| wasmtime::format_err!("no pending call with token {}", call.token))?;
        self.store.data_mut().calls.remove(pos);
        let mut response_headers: Headers = Vec::new();
        if let Some(s) = status {
            response_headers.push((":status".into(), s.to_string().into_bytes()));
            for (k, v) in headers {
                response_headers.push((k.to_ascii_lowercase(), v.as_bytes().to_vec()));
            }
        }
        let n_headers = response_headers.len() as i32;
        let body = if status.is_some() {
            body.to_vec()
        } else {
            Vec::new()
        };
        let n_body = body.len() as i32;
        {
            let st = self.store.data_mut();
            st.call_response_headers = response_headers;
            st.call_response_body = body;
            st.call_response_trailers = Vec::new();
            st.effective = self.root_id;
        }
        self.instance
            .get_typed_func::<(i32, i32, i32, i32, i32), ()>(
                &mut self.store,
                "proxy_on_http_call_response",
            )?
            .call(
                &mut self.store,
                (
                    call.context_id as i32,
                    call.token as i32,
                    n_headers,
                    n_body,
                    0,
                ),
            )?;
        {
            let st = self.store.data_mut();
            st.call_response_headers.clear();
            st.call_response_body.clear();
        }
        self.outcome(call.context_id, false)
    }

    fn outcome(&mut self, id: u32, continued_by_action: bool) -> Result<Outcome> {
        let st = self.store.data_mut();
        let calls: Vec<HttpCall> = st
            .calls
            .iter()
            .filter(|c| c.context_id == id)
            .cloned()
            .collect();
        let Some(stream) = st.streams.get_mut(&id) else {
            wasmtime::bail!("stream {id} vanished");
        };
        let outcome = if let Some(r) = stream.local_response.take() {
            Outcome::Responded(r)
        } else if stream.closed {
            Outcome::Reset
        } else if continued_by_action || stream.continued {
            Outcome::Continued(
                stream
                    .request_headers
                    .iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
            )
        } else {
            Outcome::Paused(calls)
        };
        if !matches!(outcome, Outcome::Paused(_)) {
            self.finish(id)?;
        }
        Ok(outcome)
    }

    /// Ends a stream: `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`,
    /// each only if the module exports it, as Envoy does (a module built
    /// without them is not called; one that exports them with another
    /// signature is an error).
    fn finish(&mut self, id: u32) -> Result<()> {
        self.store.data_mut().effective = id;
        if let Some(f) = self.instance.get_func(&mut self.store, "proxy_on_done") {
            f.typed::<i32, i32>(&self.store)?
                .call(&mut self.store, id as i32)?;
        }
        for name in ["proxy_on_log", "proxy_on_delete"] {
            if let Some(f) = self.instance.get_func(&mut self.store, name) {
                f.typed::<i32, ()>(&self.store)?
                    .call(&mut self.store, id as i32)?;
            }
        }
        self.store.data_mut().streams.remove(&id);
        self.store.data_mut().effective = self.root_id;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module with the callbacks a request needs, each doing nothing;
    /// with `optional`, also `proxy_on_done`, `proxy_on_log` and
    /// `proxy_on_delete`, each adding one to the exported global `ended`.
    fn minimal_filter(optional: bool) -> Vec<u8> {
        use wasm_encoder::{
            CodeSection, ConstExpr, ExportKind, ExportSection, Function, FunctionSection,
            GlobalSection, GlobalType, Instruction as I, MemorySection, MemoryType, Module,
            TypeSection, ValType as T,
        };
        let mut types = TypeSection::new();
        types.ty().function([], []); // 0: proxy_abi_version_0_2_1
        types.ty().function([T::I32, T::I32], []); // 1: proxy_on_context_create
        types.ty().function([T::I32, T::I32], [T::I32]); // 2: vm_start, configure
        types.ty().function([T::I32, T::I32, T::I32], [T::I32]); // 3: request_headers
        types.ty().function([T::I32], [T::I32]); // 4: proxy_on_done
        types.ty().function([T::I32], []); // 5: proxy_on_log, proxy_on_delete
        let mut names = vec![
            ("proxy_abi_version_0_2_1", 0),
            ("proxy_on_context_create", 1),
            ("proxy_on_vm_start", 2),
            ("proxy_on_configure", 2),
            ("proxy_on_request_headers", 3),
        ];
        if optional {
            names.extend([
                ("proxy_on_done", 4),
                ("proxy_on_log", 5),
                ("proxy_on_delete", 5),
            ]);
        }
        let mut funcs = FunctionSection::new();
        let mut code = CodeSection::new();
        let mut exports = ExportSection::new();
        for (i, (name, ty)) in names.iter().enumerate() {
            funcs.function(*ty);
            exports.export(name, ExportKind::Func, i as u32);
            let mut f = Function::new([]);
            // Types 4 and 5 are the optional callbacks only: each counts its call.
            if matches!(ty, 4 | 5) {
                f.instruction(&I::GlobalGet(0))
                    .instruction(&I::I32Const(1))
                    .instruction(&I::I32Add)
                    .instruction(&I::GlobalSet(0));
            }
            match ty {
                2 | 4 => {
                    f.instruction(&I::I32Const(1));
                }
                3 => {
                    f.instruction(&I::I32Const(0)); // Continue
                }
                _ => {}
            }
            f.instruction(&I::End);
            code.function(&f);
        }
        let mut memory = MemorySection::new();
        memory.memory(MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        exports.export("memory", ExportKind::Memory, 0);
        let mut globals = GlobalSection::new();
        globals.global(
            GlobalType {
                val_type: T::I32,
                mutable: true,
                shared: false,
            },
            &ConstExpr::i32_const(0),
        );
        exports.export("ended", ExportKind::Global, 0);
        let mut module = Module::new();
        module
            .section(&types)
            .section(&funcs)
            .section(&memory)
            .section(&globals)
            .section(&exports)
            .section(&code);
        module.finish()
    }

    /// Envoy calls the end-of-stream callbacks only when a module exports
    /// them; so does this host.
    #[test]
    fn end_of_stream_callbacks_are_called_only_when_exported() {
        let dir = std::env::temp_dir().join(format!("pwh-optional-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for optional in [false, true] {
            let path = dir.join(format!("filter-{optional}.wasm"));
            std::fs::write(&path, minimal_filter(optional)).unwrap();
            let module = FilterModule::load(&path).unwrap();
            let mut plugin = Plugin::with_config(&module, PluginOptions::default(), "{}").unwrap();
            for _ in 0..2 {
                let (_, outcome) = plugin.request(&[(":path", "/")]).unwrap();
                assert!(
                    matches!(outcome, Outcome::Continued(_)),
                    "optional={optional}"
                );
            }
            let ended = plugin
                .instance
                .get_global(&mut plugin.store, "ended")
                .unwrap()
                .get(&mut plugin.store)
                .i32()
                .unwrap();
            // Two streams, three callbacks each when exported.
            assert_eq!(ended, if optional { 6 } else { 0 });
            assert!(
                plugin.store.data().streams.is_empty(),
                "streams end either way"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
