-- Remove terminal conversations that ended before a cutoff, forget old orphans, and
-- drop the load counters of agents that owe nothing.
-- ARGV: 1 prefix, 2 cutoff, 3 limit, 4.. terminal statuses.
-- Returns the number of conversations removed.
local cutoff, limit = tonumber(ARGV[2]), tonumber(ARGV[3])

-- Take the conversations with record keys `keys` (ids `ids`) out of their parties'
-- p: indices: one MGET per 1000 records, one variadic ZREM per party.
local function unindex_parties(ids, keys)
  local by_party, blobs = {}, {}
  sliced(keys, function(...)
    for _, blob in ipairs(redis.call('MGET', ...)) do blobs[#blobs + 1] = blob end
  end)
  for i, blob in ipairs(blobs) do
    if blob then
      for _, key in ipairs(split(blob)[19] or {}) do group(by_party, key, ids[i]) end
    end
  end
  for key, list in pairs(by_party) do
    sliced(list, function(...) redis.call('ZREM', P .. 'p:' .. key, ...) end)
  end
end

-- Remove the oldest (score <= cutoff, at most n) members of zset `index` and their keys.
local function drop(index, kind, n)
  local ids = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff, 'LIMIT', 0, n)
  if #ids == 0 then return 0 end
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = P .. kind .. id end
  if kind == 'c:' then unindex_parties(ids, keys) end
  sliced(keys, function(...) redis.call('DEL', ...) end)
  redis.call('ZREMRANGEBYRANK', index, 0, #ids - 1)
  return #ids
end

local removed = 0
for i = 4, #ARGV do
  if removed >= limit then break end
  removed = removed + drop(P .. 's:' .. ARGV[i], 'c:', limit - removed)
end
drop(P .. 'orph', 'o:', limit)
-- Load counters that came down to 0 (agents owing nothing now): O(agents owing replies).
-- A negative one waits for take_over_indices (an old index not taken over yet).
local flat = redis.call('HGETALL', P .. 'ld')
local idle = {}
for i = 1, #flat, 2 do
  if flat[i + 1] == '0' then idle[#idle + 1] = flat[i] end
end
sliced(idle, function(...) redis.call('HDEL', P .. 'ld', ...) end)
return removed
