-- Advance one channel's catch-up cursor, monotonically: a compare-and-set that never
-- moves it back, atomic across replicas.
-- KEYS[1]: the transport's cursor hash (channel -> JSON [order key, native id]).
-- ARGV: 1 channel, 2 order key of the new id, 3 the native id, 4 most channels kept.
-- Returns 1 (moved), 0 (not newer: unchanged), -1 (a new channel over the bound).

-- Byte-wise order: Lua's `<` on strings follows the server's locale (strcoll).
local function before(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  if not before(cjson.decode(stored)[1], ARGV[2]) then return 0 end
elseif redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({ARGV[2], ARGV[3]}))
return 1
