-- A named lease with a fencing epoch, atomic across replicas.
-- KEYS[1]: the lease (string "<epoch>:<holder>", expiring); KEYS[2]: its epoch counter.
-- ARGV: 1 mode (acquire | renew | release), 2 holder id, 3 ttl in ms, 4 epoch (renew/release).
-- acquire: a free lease is taken with a new epoch (INCR), returned; our own is renewed
--          and its epoch returned; another holder's gives 0.
-- renew / release: only while the lease still carries our epoch and id; 1 done, 0 lost.
local mode, holder, ttl = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('GET', KEYS[1])
if mode == 'acquire' then
  if not current then
    local epoch = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[1], epoch .. ':' .. holder, 'PX', ttl)
    return epoch
  end
  local epoch, who = string.match(current, '^(%d+):(.*)$')
  if who == holder then
    redis.call('PEXPIRE', KEYS[1], ttl)
    return tonumber(epoch)
  end
  return 0
end
if current ~= ARGV[4] .. ':' .. holder then return 0 end
if mode == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('DEL', KEYS[1])
end
return 1
