-- Active conversations per agent, busiest first: the load counters (hash `ld`).
-- Costs O(agents owing replies), never O(conversations).
-- ARGV: 1 prefix, 2 limit. Returns a flat list agent1, count1, agent2, count2, ...
-- Namespaces written by earlier versions kept an index per agent instead (`a:<name>`
-- zsets listed in the `ag` set, or in a `load` zset before that): take_over_indices
-- turns them into counters, once.
local limit = tonumber(ARGV[2])
take_over_indices()
local rows = {}
local flat = redis.call('HGETALL', P .. 'ld')
for i = 1, #flat, 2 do
  local n = tonumber(flat[i + 1])
  if n > 0 then rows[#rows + 1] = {flat[i], n} end
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
