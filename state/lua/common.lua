-- Shared helpers, prepended to every script of the conversation store.
--
-- Layout (P = "{namespace}:", every key shares the hash tag, so one slot):
--   P.."c:"..id   string: header JSON array, "\n", then one JSON array per event + "\n"
--   P.."o:"..id   string: orphan RESPONSE events (same event format), with a TTL
--   P.."due"      zset id -> deadline of every active conversation and broadcast
--   P.."s:"..st   zset id -> created (active statuses) or terminal time (terminal ones)
--   P.."a:"..who  zset id -> created of active conversations `who` owes a reply on
--   P.."load"     zset who -> number of active conversations `who` owes a reply on
--   P.."n"        hash status|"broadcast"|"orphan" -> count
--   P.."orph"     zset id -> time an orphan was stored
-- Header: 1 trace, 2 kind, 3 requester, 4 assignee, 5 status, 6 depth, 7 max depth,
--   8 priority, 9 task, 10 created, 11 updated, 12 deadline (0 = none), 13 transport,
--   14 channel, 15 thread, 16 native id
-- Event: 1 type, 2 from, 3 to, 4 depth, 5 max depth, 6 status, 7 transport,
--   8 native id, 9 time, 10 excerpt, 11 fingerprint (16 hex, "" for CANCEL/TIMEOUT)
local P = ARGV[1]
local ACTIVE = {open = true, clarifying = true, handed_off = true}

local function owes(h)
  if h[5] == 'clarifying' then return h[3] end
  return h[4]
end

local function split(blob)
  local nl = string.find(blob, '\n', 1, true)
  return cjson.decode(string.sub(blob, 1, nl - 1)), string.sub(blob, nl + 1)
end

-- Take a conversation out of the indices of its current status.
local function leave(id, h)
  if h[2] == 'BROADCAST' then
    redis.call('ZREM', P .. 'due', id)
    redis.call('HINCRBY', P .. 'n', 'broadcast', -1)
    return
  end
  local st = h[5]
  redis.call('ZREM', P .. 's:' .. st, id)
  redis.call('HINCRBY', P .. 'n', st, -1)
  if ACTIVE[st] then
    local who = owes(h)
    redis.call('ZREM', P .. 'a:' .. who, id)
    if tonumber(redis.call('ZINCRBY', P .. 'load', -1, who)) <= 0 then
      redis.call('ZREM', P .. 'load', who)
    end
  end
end

-- Put a conversation into the indices of its (new) status.
local function enter(id, h, now)
  if h[2] == 'BROADCAST' then
    redis.call('ZADD', P .. 'due', h[12], id)
    redis.call('HINCRBY', P .. 'n', 'broadcast', 1)
    return
  end
  local st = h[5]
  redis.call('HINCRBY', P .. 'n', st, 1)
  if ACTIVE[st] then
    local who = owes(h)
    redis.call('ZADD', P .. 's:' .. st, h[10], id)
    redis.call('ZADD', P .. 'a:' .. who, h[10], id)
    redis.call('ZINCRBY', P .. 'load', 1, who)
    redis.call('ZADD', P .. 'due', h[12], id)
  else
    redis.call('ZADD', P .. 's:' .. st, now, id)
    redis.call('ZREM', P .. 'due', id)
  end
end

local function save(key, h, body, ev)
  local blob = cjson.encode(h) .. '\n' .. body .. cjson.encode(ev) .. '\n'
  redis.call('SET', key, blob)
  return blob
end

-- Move conversation `id` (header h, events body) to status `st` with event ev;
-- `assignee` (optional) replaces the holder once the old indices are left.
local function move(key, id, h, body, st, deadline, now, ev, assignee)
  leave(id, h)
  if assignee then h[4] = assignee end
  h[5] = st
  h[11] = now
  h[12] = deadline
  ev[6] = st
  enter(id, h, now)
  return save(key, h, body, ev)
end
