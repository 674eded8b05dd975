//! The host functions the filter imports: proxy-wasm's `env` module (ABI
//! 0.2.1) and the WASI preview1 stubs.

use super::*;

pub(super) fn define_env(linker: &mut Linker<HostState>) -> Result<Vec<&'static str>> {
    let mut defined = Vec::new();
    macro_rules! host_fn {
        ($name:literal, $f:expr) => {{
            linker.func_wrap("env", $name, $f)?;
            defined.push($name);
        }};
    }

    host_fn!("proxy_log", |mut c: Caller<'_, HostState>,
                           lvl: i32,
                           p: i32,
                           n: i32|
     -> Result<i32> {
        let msg = read_str(&mut c, p, n)?;
        eprintln!("[wasm log {lvl}] {msg}");
        c.data_mut().logs.push((lvl as u32, msg));
        Ok(status::OK)
    });
    host_fn!("proxy_get_log_level", |mut c: Caller<'_, HostState>,
                                     ret: i32|
     -> Result<i32> {
        write_u32(&mut c, ret, level::TRACE)?;
        Ok(status::OK)
    });
    host_fn!("proxy_get_current_time_nanoseconds", |mut c: Caller<
        '_,
        HostState,
    >,
                                                    ret: i32|
     -> Result<i32> {
        let now = c.data().now_ns;
        write(&mut c, ret, &now.to_le_bytes())?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_tick_period_milliseconds", |_c: Caller<
        '_,
        HostState,
    >,
                                                    _p: i32|
     -> i32 {
        status::OK
    });
    host_fn!("proxy_get_buffer_bytes", |mut c: Caller<'_, HostState>,
                                        ty: i32,
                                        start: i32,
                                        max: i32,
                                        ret_p: i32,
                                        ret_n: i32|
     -> Result<i32> {
        let data = match ty {
            BUFFER_VM_CONFIGURATION => c.data().vm_config.clone(),
            BUFFER_PLUGIN_CONFIGURATION => c.data().plugin_config.clone(),
            BUFFER_CALL_RESPONSE_BODY => c.data().call_response_body.clone(),
            _ => return Ok(status::NOT_FOUND),
        };
        let start = (start as u32 as usize).min(data.len());
        let end = start.saturating_add(max as u32 as usize).min(data.len());
        let slice = &data[start..end];
        if slice.is_empty() {
            return Ok(status::NOT_FOUND);
        }
        return_bytes(&mut c, slice, ret_p, ret_n)?;
        Ok(status::OK)
    });
    host_fn!("proxy_get_header_map_pairs", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            ret_p: i32,
                                            ret_n: i32|
     -> Result<i32> {
        let map = c
            .data_mut()
            .map_mut(ty)
            .map(|m| m.clone())
            .unwrap_or_default();
        let bytes = serialize_map(&map);
        return_bytes(&mut c, &bytes, ret_p, ret_n)?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_header_map_pairs", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            p: i32,
                                            n: i32|
     -> Result<i32> {
        let bytes = read(&mut c, p, n)?;
        let Some(new) = deserialize_map(&bytes) else {
            return Ok(status::BAD_ARGUMENT);
        };
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                *m = new;
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_get_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            kp: i32,
                                            kn: i32,
                                            ret_p: i32,
                                            ret_n: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let value = c.data_mut().map_mut(ty).and_then(|m| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&key))
                .map(|(_, v)| v.clone())
        });
        match value {
            Some(v) => {
                return_bytes(&mut c, &v, ret_p, ret_n)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_remove_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                               ty: i32,
                                               kp: i32,
                                               kn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        if let Some(m) = c.data_mut().map_mut(ty) {
            m.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
        }
        Ok(status::OK)
    });
    host_fn!("proxy_replace_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                                ty: i32,
                                                kp: i32,
                                                kn: i32,
                                                vp: i32,
                                                vn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?.to_ascii_lowercase();
        let value = read(&mut c, vp, vn)?;
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                m.retain(|(k, _)| *k != key);
                m.push((key, value));
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_add_header_map_value", |mut c: Caller<
        '_,
        HostState,
    >,
                                            ty: i32,
                                            kp: i32,
                                            kn: i32,
                                            vp: i32,
                                            vn: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?.to_ascii_lowercase();
        let value = read(&mut c, vp, vn)?;
        match c.data_mut().map_mut(ty) {
            Some(m) => {
                m.push((key, value));
                Ok(status::OK)
            }
            None => Ok(status::BAD_ARGUMENT),
        }
    });
    host_fn!("proxy_get_property", |mut c: Caller<'_, HostState>,
                                    pp: i32,
                                    pn: i32,
                                    ret_p: i32,
                                    ret_n: i32|
     -> Result<i32> {
        let path = read(&mut c, pp, pn)?;
        match c.data().properties.get(&path).cloned() {
            Some(v) => {
                return_bytes(&mut c, &v, ret_p, ret_n)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_set_property", |mut c: Caller<'_, HostState>,
                                    pp: i32,
                                    pn: i32,
                                    vp: i32,
                                    vn: i32|
     -> Result<i32> {
        let path = read(&mut c, pp, pn)?;
        let value = read(&mut c, vp, vn)?;
        c.data_mut().properties.insert(path, value);
        Ok(status::OK)
    });
    host_fn!("proxy_get_shared_data", |mut c: Caller<'_, HostState>,
                                       kp: i32,
                                       kn: i32,
                                       ret_p: i32,
                                       ret_n: i32,
                                       ret_cas: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let shared = c.data().shared.clone();
        let entry = lock(&shared).get(&key);
        match entry {
            Some(e) => {
                return_bytes(&mut c, &e.value, ret_p, ret_n)?;
                write_u32(&mut c, ret_cas, e.cas)?;
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_set_shared_data", |mut c: Caller<'_, HostState>,
                                       kp: i32,
                                       kn: i32,
                                       vp: i32,
                                       vn: i32,
                                       cas: i32|
     -> Result<i32> {
        let key = read_str(&mut c, kp, kn)?;
        let value = read(&mut c, vp, vn)?;
        let shared = c.data().shared.clone();
        let st = lock(&shared).set(&key, &value, cas as u32);
        Ok(st)
    });
    host_fn!("proxy_continue_stream", |mut c: Caller<'_, HostState>,
                                       _ty: i32|
     -> i32 {
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.continued = true;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_close_stream", |mut c: Caller<'_, HostState>,
                                    _ty: i32|
     -> i32 {
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.closed = true;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_send_local_response", |mut c: Caller<
        '_,
        HostState,
    >,
                                           code: i32,
                                           dp: i32,
                                           dn: i32,
                                           bp: i32,
                                           bn: i32,
                                           hp: i32,
                                           hn: i32,
                                           grpc: i32|
     -> Result<i32> {
        let details = read_str(&mut c, dp, dn)?;
        let body = read(&mut c, bp, bn)?;
        let raw = read(&mut c, hp, hn)?;
        let Some(headers) = deserialize_map(&raw) else {
            return Ok(status::BAD_ARGUMENT);
        };
        let response = LocalResponse {
            status: code as u32,
            details,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
            body,
            grpc_status: grpc,
        };
        let id = c.data().effective;
        match c.data_mut().streams.get_mut(&id) {
            Some(s) => {
                s.local_response = Some(response);
                Ok(status::OK)
            }
            None => Ok(status::NOT_FOUND),
        }
    });
    host_fn!("proxy_http_call", |mut c: Caller<'_, HostState>,
                                 up: i32,
                                 un: i32,
                                 hp: i32,
                                 hn: i32,
                                 bp: i32,
                                 bn: i32,
                                 tp: i32,
                                 tn: i32,
                                 timeout: i32,
                                 ret_token: i32|
     -> Result<i32> {
        let upstream = read_str(&mut c, up, un)?;
        let raw = read(&mut c, hp, hn)?;
        let body = read(&mut c, bp, bn)?;
        let _trailers = read(&mut c, tp, tn)?;
        let Some(headers) = deserialize_map(&raw) else {
            return Ok(status::BAD_ARGUMENT);
        };
        if let Some(known) = &c.data().known_clusters {
            if !known.contains(&upstream) {
                return Ok(status::BAD_ARGUMENT);
            }
        }
        let token = {
            let st = c.data_mut();
            st.next_token += 1;
            st.next_token
        };
        let call = HttpCall {
            context_id: c.data().effective,
            token,
            upstream,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
            body,
            timeout_ms: timeout as u32,
        };
        c.data_mut().calls.push(call);
        write_u32(&mut c, ret_token, token)?;
        Ok(status::OK)
    });
    host_fn!("proxy_set_effective_context", |mut c: Caller<
        '_,
        HostState,
    >,
                                             id: i32|
     -> i32 {
        c.data_mut().effective = id as u32;
        status::OK
    });
    host_fn!("proxy_done", |_c: Caller<'_, HostState>| -> i32 {
        status::OK
    });
    host_fn!("proxy_define_metric", |mut c: Caller<'_, HostState>,
                                     kind: i32,
                                     np: i32,
                                     nn: i32,
                                     ret_id: i32|
     -> Result<i32> {
        if !(0..=2).contains(&kind) {
            return Ok(status::BAD_ARGUMENT);
        }
        let name = read_str(&mut c, np, nn)?;
        let st = c.data_mut();
        let id = match st.metrics.iter().position(|m| m.name == name) {
            Some(i) => i + 1,
            None => {
                st.metrics.push(Metric {
                    name,
                    kind: kind as u32,
                    value: 0,
                });
                st.metrics.len()
            }
        };
        write_u32(&mut c, ret_id, id as u32)?;
        Ok(status::OK)
    });
    host_fn!("proxy_increment_metric", |mut c: Caller<'_, HostState>,
                                        id: i32,
                                        by: i64|
     -> i32 {
        match c.data_mut().metric_mut(id) {
            Some(m) if m.kind == 2 => status::BAD_ARGUMENT,
            Some(m) => {
                m.value = m.value.saturating_add(by);
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_record_metric", |mut c: Caller<'_, HostState>,
                                     id: i32,
                                     v: i64|
     -> i32 {
        match c.data_mut().metric_mut(id) {
            Some(m) => {
                m.value = v;
                status::OK
            }
            None => status::NOT_FOUND,
        }
    });
    host_fn!("proxy_get_metric", |mut c: Caller<'_, HostState>,
                                  id: i32,
                                  ret: i32|
     -> Result<i32> {
        let v = match c.data_mut().metric_mut(id) {
            Some(m) => m.value,
            None => return Ok(status::NOT_FOUND),
        };
        write(&mut c, ret, &(v as u64).to_le_bytes())?;
        Ok(status::OK)
    });
    Ok(defined)
}

pub(super) fn define_wasi(linker: &mut Linker<HostState>) -> Result<Vec<&'static str>> {
    const M: &str = "wasi_snapshot_preview1";
    let mut defined = Vec::new();
    macro_rules! wasi {
        ($name:literal, $f:expr) => {{
            linker.func_wrap(M, $name, $f)?;
            defined.push($name);
        }};
    }
    wasi!("fd_write", |mut c: Caller<'_, HostState>,
                       _fd: i32,
                       iovs: i32,
                       n: i32,
                       ret: i32|
     -> Result<i32> {
        let mut total = 0u32;
        for i in 0..n {
            let iov = read(&mut c, iovs + i * 8, 8)?;
            let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
            let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
            let bytes = read(&mut c, ptr as i32, len as i32)?;
            c.data_mut().stdout.extend_from_slice(&bytes);
            total += len;
        }
        write_u32(&mut c, ret, total)?;
        Ok(0)
    });
    wasi!("random_get", |mut c: Caller<'_, HostState>,
                         p: i32,
                         n: i32|
     -> Result<i32> {
        let mut bytes = vec![0u8; n as u32 as usize];
        for b in &mut bytes {
            let st = c.data_mut();
            st.random_state = st
                .random_state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (st.random_state >> 33) as u8;
        }
        write(&mut c, p, &bytes)?;
        Ok(0)
    });
    wasi!("clock_time_get", |mut c: Caller<'_, HostState>,
                             _id: i32,
                             _prec: i64,
                             ret: i32|
     -> Result<i32> {
        let now = c.data().now_ns;
        write(&mut c, ret, &now.to_le_bytes())?;
        Ok(0)
    });
    for name in ["environ_sizes_get", "args_sizes_get"] {
        linker.func_wrap(
            M,
            name,
            |mut c: Caller<'_, HostState>, a: i32, b: i32| -> Result<i32> {
                write_u32(&mut c, a, 0)?;
                write_u32(&mut c, b, 0)?;
                Ok(0)
            },
        )?;
        defined.push(name);
    }
    for name in ["environ_get", "args_get"] {
        linker.func_wrap(
            M,
            name,
            |_c: Caller<'_, HostState>, _a: i32, _b: i32| -> i32 { 0 },
        )?;
        defined.push(name);
    }
    wasi!("proc_exit", |_c: Caller<'_, HostState>,
                        code: i32|
     -> Result<()> {
        wasmtime::bail!("proc_exit({code})")
    });
    Ok(defined)
}
