-- Active conversations per agent, busiest first: ZCARD of each agent's index.
-- Costs O(agents in the set), never O(conversations).
-- ARGV: 1 prefix, 2 limit. Returns a flat list agent1, count1, agent2, count2, ...
-- Namespaces written before the set existed kept a `load` zset instead: its names
-- are taken over once (and the old `load` and `n` keys dropped).
local limit = tonumber(ARGV[2])
local old = redis.call('ZRANGE', P .. 'load', 0, -1)
if #old > 0 then
  sliced(old, function(...) redis.call('SADD', P .. 'ag', ...) end)
  redis.call('DEL', P .. 'load', P .. 'n')
end
local rows = {}
for _, who in ipairs(redis.call('SMEMBERS', P .. 'ag')) do
  local n = redis.call('ZCARD', P .. 'a:' .. who)
  if n > 0 then rows[#rows + 1] = {who, n} end
end
table.sort(rows, function(x, y)
  if x[2] ~= y[2] then return x[2] > y[2] end
  return x[1] > y[1]
end)
local out = {}
for i = 1, math.min(limit, #rows) do
  out[#out + 1] = rows[i][1]
  out[#out + 1] = rows[i][2]
end
return out
