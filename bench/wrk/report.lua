-- Shared by the hook benchmark's wrk scripts: print wrk's own summary as one JSON line at the end,
-- so bench/hooks_load.py reads figures, not wrk's human-readable text.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect_errors": %d, "read_errors": %d, ' ..
    '"write_errors": %d, "status_errors": %d, "timeouts": %d, "p50_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
