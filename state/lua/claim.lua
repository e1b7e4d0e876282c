-- Claim due conversations: mark each timed out and return it, atomically, so with
-- several gateways on one Redis each due conversation is claimed exactly once.
-- Expired broadcasts are removed silently (nobody owes a reply on them).
-- ARGV: 1 prefix, 2 now, 3 limit, 4 timeout excerpt prefix.
-- Returns a flat list id1, blob1, id2, blob2, ... of the claimed conversations.
-- One batch costs a fixed handful of commands, not a few per conversation: MGET the
-- records, drop the claimed ranks from `due` at once, one ZREM per status, one HINCRBY
-- per agent owing replies, one ZADD into s:timeout, one into notify (notices owed), one
-- MSET (sliced by 1000 items).
local now, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local due = P .. 'due'
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, limit)
if #ids == 0 then return {} end
local keys = {}
for i, id in ipairs(ids) do keys[i] = P .. 'c:' .. id end
local blobs = {}
sliced(keys, function(...)
  for _, blob in ipairs(redis.call('MGET', ...)) do blobs[#blobs + 1] = blob end
end)
-- These are exactly ranks 0 .. #ids-1 of `due`; every one of them leaves it.
redis.call('ZREMRANGEBYRANK', due, 0, #ids - 1)

local by_status, by_agent, timed, writes, gone, out = {}, {}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  local blob = blobs[i]
  if blob then
    local h, body = split(blob)
    if h[2] == 'BROADCAST' then
      gone[#gone + 1] = keys[i]
    elseif ACTIVE[h[5]] then
      local who = owes(h)
      group(by_status, h[5], id)
      group(by_agent, owes_key(h), id)
      local ev = {'TIMEOUT', 'bpgw', who, h[6], h[7], 'timeout', h[13], '', now,
                  ARGV[4] .. who .. ' (was ' .. h[5] .. ')', ''}
      h[5], h[11], h[12] = 'timeout', now, 0
      local new = encode(h, body, ev)
      timed[#timed + 1] = now
      timed[#timed + 1] = id
      writes[#writes + 1] = keys[i]
      writes[#writes + 1] = new
      out[#out + 1] = id
      out[#out + 1] = new
    end
  end
end
for st, list in pairs(by_status) do
  sliced(list, function(...) redis.call('ZREM', P .. 's:' .. st, ...) end)
end
for who, list in pairs(by_agent) do
  redis.call('HINCRBY', P .. 'ld', who, -#list)
end
sliced(timed, function(...) redis.call('ZADD', P .. 's:timeout', ...) end)
-- Their notices are owed until the gateway journals them (Outbox.enqueue_once removes the
-- mark in the same step): a replica dying in between leaves the mark for another sweep.
sliced(timed, function(...) redis.call('ZADD', P .. 'notify', ...) end)
sliced(writes, function(...) redis.call('MSET', ...) end)
sliced(gone, function(...) redis.call('DEL', ...) end)
return out
