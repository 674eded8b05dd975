-- wrk script for scripts/bench.sh. Settings come from the environment:
--   WRK_METHOD   GET (default) or POST
--   WRK_BODY     request body (sent as application/json)
--   WRK_TOKEN    bearer token (Authorization header)
--   WRK_REGISTER set: every request registers a new user (unique names from
--                WRK_TAG, the thread number and a counter)
-- done() prints one JSON line (latencies in microseconds).

local method = os.getenv("WRK_METHOD") or "GET"
local body = os.getenv("WRK_BODY")
local token = os.getenv("WRK_TOKEN")
local register = os.getenv("WRK_REGISTER")
local tag = os.getenv("WRK_TAG") or "x"

wrk.method = method
if body and body ~= "" then
  wrk.body = body
end
if method ~= "GET" then
  wrk.headers["Content-Type"] = "application/json"
end
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("tid", thread_count)
end

if register and register ~= "" then
  local n = 0
  function request()
    n = n + 1
    local name = string.format("r%s_%d_%d", tag, tid or 0, n)
    local b = string.format(
      '{"email":"%s@example.com","username":"%s","password":"Str0ng!Passw0rd"}', name, name)
    return wrk.format("POST", nil, nil, b)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f,' ..
    '"errors_connect":%d,"errors_read":%d,"errors_write":%d,"errors_status":%d,"errors_timeout":%d}\n',
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
