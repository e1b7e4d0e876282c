-- Shared helpers, prepended to every script of the conversation store.
--
-- Layout (P = "{namespace}:", every key shares the hash tag, so one slot):
--   P.."c:"..id   string: header JSON array, "\n", then one JSON array per event + "\n"
--   P.."o:"..id   string: orphan RESPONSE events (same event format), with a TTL
--   P.."due"      zset id -> deadline of every active conversation and live broadcast
--   P.."s:"..st   zset id -> created (active statuses) or terminal time (terminal ones)
--   P.."a:"..k    zset id -> created of active conversations the agent with canonical
--                 name key k (protocol.names.name_key) owes a reply on
--   P.."ag"       set of name keys that may have an a:<k> index (pruned by purge)
--   P.."p:"..key  zset id -> created of every conversation (any status) the agent with
--                 canonical name key `key` is a party to: requester, addressee, every
--                 assignee; removed with the conversation by purge
--   P.."orph"     zset id -> time an orphan was stored
-- No counters: counts are ZCARDs of these indices (broadcasts = due - active), load is
-- ZCARD of a:<k>, so a transition writes only the indices that really change.
-- Header: 1 trace, 2 kind, 3 requester, 4 assignee, 5 status, 6 depth, 7 max depth,
--   8 priority, 9 task, 10 created, 11 updated, 12 deadline (0 = none), 13 transport,
--   14 channel, 15 thread, 16 native id, 17 requester key, 18 assignee key,
--   19 party keys (a list, at most one per depth step; records written before it have none)
-- Event: 1 type, 2 from, 3 to, 4 depth, 5 max depth, 6 status, 7 transport,
--   8 native id, 9 time, 10 excerpt, 11 fingerprint (16 hex, "" for CANCEL/TIMEOUT)
local P = ARGV[1]
local ACTIVE = {open = true, clarifying = true, handed_off = true}

local function owes(h)
  if h[5] == 'clarifying' then return h[3] end
  return h[4]
end

-- The canonical name key of who owes the reply (header 17 requester key, 18 assignee
-- key; records written before the keys were kept: the name's ASCII lower case).
local function owes_key(h)
  if h[5] == 'clarifying' then return h[17] or string.lower(h[3]) end
  return h[18] or string.lower(h[4])
end

local function split(blob)
  local nl = string.find(blob, '\n', 1, true)
  return cjson.decode(string.sub(blob, 1, nl - 1)), string.sub(blob, nl + 1)
end

local function encode(h, body, ev)
  return cjson.encode(h) .. '\n' .. body .. cjson.encode(ev) .. '\n'
end

-- Index a new conversation (header h of a REQUEST or BROADCAST).
local function enter(id, h)
  if h[2] ~= 'BROADCAST' then
    local who = h[18]
    redis.call('ZADD', P .. 's:' .. h[5], h[10], id)
    redis.call('ZADD', P .. 'a:' .. who, h[10], id)
    redis.call('SADD', P .. 'ag', who)
    for _, key in ipairs(h[19]) do redis.call('ZADD', P .. 'p:' .. key, h[10], id) end
  end
  redis.call('ZADD', P .. 'due', h[12], id)
end

-- Make the agent with canonical key `key` a party of conversation `id` (header h):
-- listed in h[19] and indexed under p:<key>, once. '' and 'all' are nobody.
local function party(id, h, key)
  if key == '' or key == 'all' then return end
  local keys = h[19]
  for _, k in ipairs(keys) do
    if k == key then return end
  end
  keys[#keys + 1] = key
  redis.call('ZADD', P .. 'p:' .. key, h[10], id)
end

-- Re-index conversation `id` that was in status st0 owed by w0 and now has header h:
-- only the indices that change are written.
local function reindex(id, h, st0, w0, now)
  local st = h[5]
  local active = ACTIVE[st]
  if st ~= st0 then
    redis.call('ZREM', P .. 's:' .. st0, id)
    redis.call('ZADD', P .. 's:' .. st, active and h[10] or now, id)
  end
  if active then
    local who = owes_key(h)
    if who ~= w0 then
      redis.call('ZREM', P .. 'a:' .. w0, id)
      redis.call('ZADD', P .. 'a:' .. who, h[10], id)
      redis.call('SADD', P .. 'ag', who)
    end
    redis.call('ZADD', P .. 'due', h[12], id)
  else
    redis.call('ZREM', P .. 'a:' .. w0, id)
    redis.call('ZREM', P .. 'due', id)
  end
end

-- Move conversation `id` (header h, events body) to status `st` with event ev;
-- `assignee` with its name key `ak` (optional) replaces the holder. Returns the new record.
local function move(key, id, h, body, st, deadline, now, ev, assignee, ak)
  local st0, w0 = h[5], owes_key(h)
  if assignee then h[4], h[18] = assignee, ak end
  h[5] = st
  h[11] = now
  h[12] = deadline
  ev[6] = st
  reindex(id, h, st0, w0, now)
  local blob = encode(h, body, ev)
  redis.call('SET', key, blob)
  return blob
end

-- Append the outbox journal entry ARGV[3] (JSON, "" for none) for an accepted message,
-- in the same atomic step as the state change (docs/gateway.md, "Outbox"). Each
-- delivery d = {transport, channel, thread, recipient, reply_to}; one on the channel
-- where conversation h started goes into its thread and replies to its first message.
-- h is nil for an orphan RESPONSE (no conversation: no placement).
local function journal(h)
  local j = ARGV[3]
  if not j or j == '' then return end
  if h then
    local e = cjson.decode(j)
    local moved = false
    for _, d in ipairs(e.d) do
      if d[1] == h[13] and d[2] == h[14] then
        if d[3] == '' then d[3] = h[15] end
        d[5] = h[16]
        moved = true
      end
    end
    if moved then j = cjson.encode(e) end
  end
  redis.call('XADD', P .. 'ob:j', '*', 'm', j)
end

-- Append item to the list groups[name] (created on first use).
local function group(groups, name, item)
  local list = groups[name]
  if not list then
    list = {}
    groups[name] = list
  end
  list[#list + 1] = item
end

-- Call f with the items of list in slices (Lua's unpack takes a few thousand at most).
local function sliced(list, f)
  for i = 1, #list, 1000 do
    f(unpack(list, i, math.min(i + 999, #list)))
  end
end
