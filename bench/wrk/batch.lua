-- Batches of events, as a router's client flushes them: `-- SIZE m0000 m0001 ...` sends batches of SIZE
-- events spread round-robin over the ids given (a few pre-built bodies, rotated):
--   wrk -t2 -c8 -d10s -s bench/wrk/batch.lua http://127.0.0.1:8000 -- 1000 m0000 m0001 ...
dofile(debug.getinfo(1, "S").source:sub(2):match("(.*/)") .. "report.lua")
local bodies = {}
local n = 0

function init(args)
  local size = tonumber(args[1])
  local models = {}
  for i = 2, #args do models[#models + 1] = args[i] end
  for b = 1, 8 do
    local evs = {}
    for i = 1, size do
      evs[i] = '{"model": "' .. models[(b * 7919 + i) % #models + 1] .. '"}'
    end
    bodies[b] = '{"events": [' .. table.concat(evs, ",") .. ']}'
  end
end

function request()
  n = n + 1
  return wrk.format("POST", "/hooks/requests", {["Content-Type"] = "application/json"},
                    bodies[n % #bodies + 1])
end
