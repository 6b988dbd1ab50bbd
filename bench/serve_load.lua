-- wrk script for bench/serve_load.py: POST the JSON body in $VITC_BODY
-- (a real photo as a base64 data: URL) to the URL given to wrk; with
-- $VITC_LIMIT, each thread stops after that many replies (a fixed count
-- of requests, for the memory run). done() prints one JSON line after
-- "VITC-JSON " for the driver: requests, errors, latency percentiles (us).
local body_path = os.getenv("VITC_BODY")
local f = assert(io.open(body_path, "rb"), "VITC_BODY: cannot open " .. tostring(body_path))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("VITC_KEY")
if key and key ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. key
end

local limit = tonumber(os.getenv("VITC_LIMIT") or "")
if limit then
    local seen = 0
    -- defined only with a limit: a response() callback makes wrk parse
    -- every reply, which costs throughput
    function response(status, headers, body)
        seen = seen + 1
        if seen >= limit then
            wrk.thread:stop()
        end
    end
end

function done(summary, latency, requests)
    local e = summary.errors
    local p = {}
    for _, q in ipairs({50, 90, 99, 99.9}) do
        p[#p + 1] = string.format('"%s": %d', tostring(q), latency:percentile(q))
    end
    io.write(string.format(
        'VITC-JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
        '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
        '"latency_us": {"mean": %.1f, "max": %d, %s}}\n',
        summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
        e.status, e.timeout, latency.mean, latency.max, table.concat(p, ", ")))
end
