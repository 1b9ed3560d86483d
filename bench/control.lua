-- wrk script for bench/control.sh. Every request to /join carries the next
-- player's ticket (a JWT), so each one costs the server a ticket check, two
-- rate-limit lookups and a signed token; /healthz (no header) is the anchor.
local path = os.getenv("CONTROL_PATH") or "/healthz"
local tickets = {}
local file = os.getenv("TICKETS")
if file and file ~= "" then
  for line in io.lines(file) do tickets[#tickets + 1] = line end
end
local n = 0

function request()
  if #tickets == 0 then
    return wrk.format("GET", path)
  end
  n = n + 1
  return wrk.format("GET", path, { ["Authorization"] = "Bearer " .. tickets[(n % #tickets) + 1] })
end
