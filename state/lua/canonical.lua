-- Load counters under a name's canonical key (ConversationStore.canonical_agent_indices).
-- ARGV: 1 prefix, then pairs (field as stored, its canonical key) to merge into the key.
-- Takes over an earlier layout's indices first (take_over_indices). Returns the fields
-- of the load hash when called with no pairs, else the number of fields moved.
take_over_indices()
if #ARGV == 1 then return redis.call('HKEYS', P .. 'ld') end
local moved = 0
for i = 2, #ARGV, 2 do
  local n = redis.call('HGET', P .. 'ld', ARGV[i])
  if n then
    redis.call('HINCRBY', P .. 'ld', ARGV[i + 1], n)
    redis.call('HDEL', P .. 'ld', ARGV[i])
    moved = moved + 1
  end
end
return moved
