-- A GET of the path given after `--` (default /healthz), e.g. `-- /hooks/route?model=m0001`.
dofile(debug.getinfo(1, "S").source:sub(2):match("(.*/)") .. "report.lua")
local path = "/healthz"

function init(args)
  if args[1] then path = args[1] end
end

function request()
  return wrk.format("GET", path)
end
