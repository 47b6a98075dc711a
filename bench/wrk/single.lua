-- One event per request, each for a model drawn at random from the ids given after `--`:
--   wrk -t2 -c16 -d10s -s bench/wrk/single.lua http://127.0.0.1:8000 -- m0000 m0001 ...
dofile(debug.getinfo(1, "S").source:sub(2):match("(.*/)") .. "report.lua")
local bodies = {}

function init(args)
  for i, model in ipairs(args) do
    bodies[i] = '{"model": "' .. model .. '", "count": 1}'
  end
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
end

function request()
  return wrk.format("POST", "/hooks/requests", {["Content-Type"] = "application/json"},
                    bodies[math.random(#bodies)])
end
