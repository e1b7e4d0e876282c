-- Remove terminal conversations that ended before a cutoff, and forget old orphans.
-- ARGV: 1 prefix, 2 cutoff, 3 limit, 4.. terminal statuses.
-- Returns the number of conversations removed.
local cutoff, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local removed = 0
for i = 4, #ARGV do
  local st = ARGV[i]
  if removed >= limit then break end
  local ids = redis.call('ZRANGEBYSCORE', P .. 's:' .. st, '-inf', cutoff,
                         'LIMIT', 0, limit - removed)
  for _, id in ipairs(ids) do
    redis.call('DEL', P .. 'c:' .. id)
    redis.call('ZREM', P .. 's:' .. st, id)
    redis.call('HINCRBY', P .. 'n', st, -1)
  end
  removed = removed + #ids
end
local old = redis.call('ZRANGEBYSCORE', P .. 'orph', '-inf', cutoff, 'LIMIT', 0, limit)
for _, id in ipairs(old) do
  redis.call('ZREM', P .. 'orph', id)
  redis.call('DEL', P .. 'o:' .. id)
  redis.call('HINCRBY', P .. 'n', 'orphan', -1)
end
return removed
