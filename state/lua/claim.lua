-- Claim due conversations: mark each timed out and return it, atomically, so with
-- several gateways on one Redis each due conversation is claimed exactly once.
-- Expired broadcasts are removed silently (nobody owes a reply on them).
-- ARGV: 1 prefix, 2 now, 3 limit, 4 timeout excerpt prefix.
-- Returns a flat list id1, blob1, id2, blob2, ... of the claimed conversations.
local now, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', P .. 'due', '-inf', now, 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(ids) do
  local key = P .. 'c:' .. id
  local blob = redis.call('GET', key)
  if not blob then
    redis.call('ZREM', P .. 'due', id)
  else
    local h, body = split(blob)
    if h[2] == 'BROADCAST' then
      leave(id, h)
      redis.call('DEL', key)
    elseif not ACTIVE[h[5]] then
      redis.call('ZREM', P .. 'due', id)
    else
      local who = owes(h)
      local ev = {'TIMEOUT', 'bpgw', who, h[6], h[7], '', h[13], '', now,
                  ARGV[4] .. who .. ' (was ' .. h[5] .. ')', ''}
      out[#out + 1] = id
      out[#out + 1] = move(key, id, h, body, 'timeout', 0, now, ev)
    end
  end
end
return out
