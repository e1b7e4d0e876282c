-- Shared helpers, prepended to every script of the conversation store.
--
-- Layout (P = "{namespace}:", every key shares the hash tag, so one slot):
--   P.."c:"..id   string: header JSON array, "\n", then one JSON array per event + "\n"
--   P.."o:"..id   string: orphan RESPONSE events (same event format), with a TTL
--   P.."due"      zset id -> deadline of every active conversation and live broadcast
--   P.."s:"..st   zset id -> created (active statuses) or terminal time (terminal ones)
--   P.."ld"       hash name key (protocol.names.name_key) -> active conversations that
--                 agent owes a reply on (fields at 0 are dropped by purge)
--   P.."p:"..key  zset id -> created of every conversation (any status) the agent with
--                 canonical name key `key` is a party to: requester, addressee, every
--                 assignee; removed with the conversation by purge
--   P.."orph"     zset id -> time an orphan was stored
-- Counts are ZCARDs of these indices (broadcasts = due - active); the load counters are
-- written by the same atomic steps that move a conversation, so a transition writes only
-- the indices and counters that really change.
-- Header: 1 trace, 2 kind, 3 requester, 4 assignee, 5 status, 6 depth, 7 max depth,
--   8 priority, 9 task, 10 created, 11 updated, 12 deadline (0 = none), 13 transport,
--   14 channel, 15 thread, 16 native id, 17 requester key, 18 assignee key,
--   19 party keys (a list; records written before it have none), 20 1 when the events'
--   times are seconds since created (records written before it: epoch seconds)
-- Stored compactly (split/encode convert): 17 and 18 are '' when the key is the name's
-- ASCII lower case, 19 leaves out the requester's and the assignee's keys.
-- Event: 1 type, 2 from, 3 to, 4 depth, 5 max depth, 6 status, 7 transport ('' = the
--   header's), 8 native id ('' in the first event = the header's), 9 time (see header
--   20), 10 excerpt, 11 fingerprint (16 hex, "" for CANCEL/TIMEOUT)
local P = ARGV[1]
-- Keys every step writes, made once per run (each concatenation is a string to build and
-- hash again): the deadlines, the load counters, the journal; status and party indices
-- by status and by name key (see index()).
local DUE, LD, JOURNAL = P .. 'due', P .. 'ld', P .. 'ob:j'
local STATUS_KEYS, PARTY_KEYS = {}, {}
local ACTIVE = {open = true, clarifying = true, handed_off = true}

-- Call f with the items of list in slices (Lua's unpack takes a few thousand at most).
local function sliced(list, f)
  for i = 1, #list, 1000 do
    f(unpack(list, i, math.min(i + 999, #list)))
  end
end

-- Index writes, combined: apply.lua runs a batch of messages and writes each sorted set
-- and each counter once at its end (a batch of new REQUESTs costs one ZADD per index,
-- not one per message). enter, party and move only buffer; a script using them calls
-- flush_indices() before it returns. No script reads an index it has buffered writes
-- for, so buffering changes how the writes travel, not what they do.
local ZW, ZK, HW, HK = {}, {}, {}, {}

-- The table map[name], created on first use (and its name appended to order, if given).
local function table_of(map, name, order)
  local t = map[name]
  if not t then
    t = {}
    map[name] = t
    if order then order[#order + 1] = name end
  end
  return t
end

-- The key P .. prefix .. name, from `made` (a table by name) once made.
local function index(made, prefix, name)
  local key = made[name]
  if not key then
    key = P .. prefix .. name
    made[name] = key
  end
  return key
end

-- Put `member` into the sorted set `key` with `score` (false: remove it).
local function zput(key, member, score)
  table_of(ZW, key, ZK)[member] = score
end

-- Add n to field `field` of the hash `key`.
local function hincr(key, field, n)
  local m = table_of(HW, key, HK)
  m[field] = (m[field] or 0) + n
end

-- redis.call(cmd, key, ...) with list[1] .. list[n], in slices as sliced().
local function call_first(cmd, key, list, n)
  for i = 1, n, 1000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 999, n)))
  end
end

-- Write the buffered index changes: per sorted set one ZREM and one ZADD (sliced), per
-- counter that moved one HINCRBY. The arguments of every set are gathered in the same
-- two tables (their first na and nd items): a table grown an item at a time is
-- reallocated at every power of two, and most sets of a batch get an item or two.
local function flush_indices()
  local adds, dels = {}, {}
  for i = 1, #ZK do  -- (numeric loops: ipairs calls a C function per item)
    local key = ZK[i]
    local na, nd = 0, 0
    for member, score in pairs(ZW[key]) do
      if score then
        adds[na + 1] = score
        adds[na + 2] = member
        na = na + 2
      else
        nd = nd + 1
        dels[nd] = member
      end
    end
    call_first('ZREM', key, dels, nd)
    call_first('ZADD', key, adds, na)
  end
  for i = 1, #HK do
    local key = HK[i]
    for field, n in pairs(HW[key]) do
      if n ~= 0 then redis.call('HINCRBY', key, field, n) end
    end
  end
  ZW, ZK, HW, HK = {}, {}, {}, {}
end

-- Conversation records this script has read or written, by key (false: none), so a
-- batch reads each at most once and a later message sees an earlier one's write.
local REC = {}

-- Store record `blob` under `key`.
local function put_record(key, blob)
  redis.call('SET', key, blob)
  REC[key] = blob
end

local function owes(h)
  if h[5] == 'clarifying' then return h[3] end
  return h[4]
end

-- The canonical name key of who owes the reply (header 17 requester key, 18 assignee
-- key, as split() gives them).
local function owes_key(h)
  if h[5] == 'clarifying' then return h[17] end
  return h[18]
end

-- Each name's ASCII lower case (false when it is not ASCII), by name, found once per run:
-- a batch writes the same names again and again, and a library call costs about 1,000
-- instructions.
local LOWER = {}

-- The name key stored for `name`: '' when it is the name's ASCII lower case.
local function short_key(name, key)
  local low = LOWER[name]
  if low == nil then
    low = string.lower(name)
    if string.find(name, '[\128-\255]') then low = false end
    LOWER[name] = low
  end
  if key == low then return '' end
  return key
end

-- Add `key` to the list `keys` unless it is there already or nobody ('' or 'all').
local function add_key(keys, key)
  if key == '' or key == 'all' then return false end
  for _, k in ipairs(keys) do
    if k == key then return false end
  end
  keys[#keys + 1] = key
  return true
end

-- Header (with full keys and party list, see the layout above) and events of a record.
local function split(blob)
  local nl = string.find(blob, '\n', 1, true)
  local h = cjson.decode(string.sub(blob, 1, nl - 1))
  -- Records written before the keys were kept: their names' ASCII lower case.
  if not h[17] or h[17] == '' then h[17] = string.lower(h[3]) end
  if not h[18] or h[18] == '' then h[18] = string.lower(h[4]) end
  if h[19] then
    add_key(h[19], h[17])
    add_key(h[19], h[18])
  end
  return h, string.sub(blob, nl + 1)
end

-- encode() through cjson's tables (see there).
local function encode_tables(h, k17, k18, rest, body, ev)
  local c = {h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12],
             h[13], h[14], h[15], h[16], k17, k18}
  if rest then
    c[19] = rest
    c[20] = h[20]
  end
  return cjson.encode(c) .. '\n' .. body .. cjson.encode(ev) .. '\n'
end

-- The JSON text of the scalars written this run, by value (see json()).
local JSON = {}
-- Empty positions (nil) json() met since encode() started.
local HOLES = 0

-- cjson.encode(v) of a scalar v (a string, number, boolean or cjson.null), remembered:
-- a batch writes the same names, statuses and small numbers again and again, and cjson
-- formats every number with snprintf (about 3,000 instructions). 0 is not kept: it shares
-- its table key with -0, which cjson writes as "-0". nil (an empty position) is "null",
-- and counted in HOLES.
local function json(v)
  local s = JSON[v]
  if s then return s end
  if v == nil then
    HOLES = HOLES + 1
    return 'null'
  end
  if v == 0 then return 1 / v < 0 and '-0' or '0' end
  s = cjson.encode(v)
  JSON[v] = s
  return s
end

-- The record of header h, events body and the new event ev, stored compactly.
local function encode(h, body, ev)
  local k17, k18 = short_key(h[3], h[17]), short_key(h[4], h[18])
  local parties, rest = h[19], nil
  if parties then
    rest = {}
    for i = 1, #parties do
      local k = parties[i]
      if k ~= h[17] and k ~= h[18] then rest[#rest + 1] = k end
    end
  end
  if ev[7] == h[13] then ev[7] = '' end
  if body == '' and ev[8] == h[16] then ev[8] = '' end
  -- Milliseconds, as the caller rounds `now`: "12.345" instead of "1700000012.345".
  if h[20] == 1 then ev[9] = math.floor((ev[9] - h[10]) * 1000 + 0.5) / 1000 end
  -- Written out, the same text as cjson.encode of the arrays, for about half the
  -- instructions. Text that differs from message to message (trace id, task, native id,
  -- excerpt, fingerprint) goes to cjson directly; the rest is looked up in JSON first
  -- (a call of json() costs more than the lookup). An empty party list is an empty
  -- table, which cjson writes as {}.
  HOLES = 0
  local e, J, j = cjson.encode, JSON, json
  local tail = ']\n'
  if rest then
    tail = ',' .. (#rest > 0 and e(rest) or '{}') ..
        (h[20] == nil and ']\n' or (',' .. (J[h[20]] or j(h[20])) .. ']\n'))
  end
  local text = '[' .. e(h[1]) .. ',' .. (J[h[2]] or j(h[2])) .. ',' ..
      (J[h[3]] or j(h[3])) .. ',' .. (J[h[4]] or j(h[4])) .. ',' .. (J[h[5]] or j(h[5])) ..
      ',' .. (J[h[6]] or j(h[6])) .. ',' .. (J[h[7]] or j(h[7])) .. ',' ..
      (J[h[8]] or j(h[8])) .. ',' .. e(h[9]) .. ',' .. (J[h[10]] or j(h[10])) .. ',' ..
      (J[h[11]] or j(h[11])) .. ',' .. (J[h[12]] or j(h[12])) .. ',' ..
      (J[h[13]] or j(h[13])) .. ',' .. (J[h[14]] or j(h[14])) .. ',' ..
      (J[h[15]] or j(h[15])) .. ',' .. e(h[16]) .. ',' .. (J[k17] or j(k17)) .. ',' ..
      (J[k18] or j(k18)) .. tail .. body .. '[' .. (J[ev[1]] or j(ev[1])) .. ',' ..
      (J[ev[2]] or j(ev[2])) .. ',' .. (J[ev[3]] or j(ev[3])) .. ',' ..
      (J[ev[4]] or j(ev[4])) .. ',' .. (J[ev[5]] or j(ev[5])) .. ',' ..
      (J[ev[6]] or j(ev[6])) .. ',' .. (J[ev[7]] or j(ev[7])) .. ',' ..
      (J[ev[8]] or j(ev[8])) .. ',' .. (J[ev[9]] or j(ev[9])) .. ',' .. e(ev[10]) .. ',' ..
      e(ev[11]) .. ']\n'
  -- With an empty position cjson decides the array's length (or refuses a sparse one).
  if HOLES > 0 or h[1] == nil or h[9] == nil or h[16] == nil or ev[10] == nil or
      ev[11] == nil then
    return encode_tables(h, k17, k18, rest, body, ev)
  end
  return text
end

-- Index a new conversation `id` of kind `kind` (REQUEST or BROADCAST) in status `st`,
-- created at `created` with deadline `deadline`, from the agent with name key `fk` to the
-- one with `tk` (its parties: both, or the first alone when they are one or `tk` is all).
-- zput, hincr and the keys' look-ups are written out: this runs for every new
-- conversation, and each Lua call costs hundreds of instructions (about 4,000 a message).
local function enter(id, kind, st, created, deadline, fk, tk)
  local zw = ZW
  if kind ~= 'BROADCAST' then
    local k = STATUS_KEYS[st] or index(STATUS_KEYS, 's:', st)
    local t = zw[k] or table_of(zw, k, ZK)
    t[id] = created
    local m = HW[LD] or table_of(HW, LD, HK)
    m[tk] = (m[tk] or 0) + 1
    -- The parties' sets, fk's then tk's: one usually new in the batch (a sender's) is
    -- made with its first member (a table made empty is reallocated for it).
    local pk, next_pk = fk, (tk ~= fk and tk ~= 'all') and tk
    while pk do
      k = PARTY_KEYS[pk] or index(PARTY_KEYS, 'p:', pk)
      t = zw[k]
      if t then
        t[id] = created
      else
        zw[k] = {[id] = created}
        ZK[#ZK + 1] = k
      end
      pk, next_pk = next_pk, false
    end
  end
  local t = zw[DUE] or table_of(zw, DUE, ZK)
  t[id] = deadline
end

-- Make the agent with canonical key `key` a party of conversation `id` (header h):
-- listed in h[19] and indexed under p:<key>, once. '' and 'all' are nobody.
local function party(id, h, key)
  if add_key(h[19], key) then zput(index(PARTY_KEYS, 'p:', key), id, h[10]) end
end

-- Re-index conversation `id` that was in status st0 owed by w0 and now has header h:
-- only the indices and load counters that change are written.
local function reindex(id, h, st0, w0, now)
  local st = h[5]
  local active = ACTIVE[st]
  if st ~= st0 then
    zput(index(STATUS_KEYS, 's:', st0), id, false)
    zput(index(STATUS_KEYS, 's:', st), id, active and h[10] or now)
  end
  if active then
    local who = owes_key(h)
    if who ~= w0 then
      hincr(LD, w0, -1)
      hincr(LD, who, 1)
    end
    zput(DUE, id, h[12])
  else
    hincr(LD, w0, -1)
    zput(DUE, id, false)
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
  put_record(key, blob)
  return blob
end

-- Whether JSON writes string s as it is (no quote, backslash, slash or control
-- character), by string, found once per run (a batch's origins repeat).
local PLAIN = {}

local function plain(s)
  local p = PLAIN[s]
  if p == nil then
    p = string.find(s, '^[^"\\/%c]*$') ~= nil
    PLAIN[s] = p
  end
  return p
end

-- Append the outbox journal entry j (JSON, "" for none) for an accepted message,
-- in the same atomic step as the state change (docs/gateway.md, "Outbox"). Each
-- delivery d = {transport, channel, thread, recipient, reply_to}; one on the channel
-- where conversation h started goes into its thread and replies to its first message.
-- h is nil for an orphan RESPONSE (no conversation: no placement); only its fields 13-16
-- (transport, channel, thread, native id) are read, which a message's fields hold at the
-- same places (apply.lua passes those for a new conversation).
-- Whether journal entry j may hold a delivery on transport t, channel c: false only when
-- its delivery list (the text between '"d":[' and '],"s":', which can only be the keys
-- themselves: inside a JSON string every quote is escaped) has no array starting with
-- those two strings. Only for strings JSON writes as they are (no quote, backslash, slash
-- or control character), so the text compared is exact; true whenever unsure. It spares
-- decoding the entry for the common step that places nothing (a REQUEST never goes back
-- to the channel it came from). An entry laid out as gateway.outbox.journal_entry writes
-- it ('{"k":"' first, the deliveries "d" then the sender "s" last) is searched once, for
-- the array itself: outside the strings an array starting with two strings is a delivery
-- or the sender, which comes after every delivery and right after '"s":'. (Searching
-- for '"d":[' first stopped at every quote of the message's text before it.)
local function may_place(j, t, c)
  if not (plain(t) and plain(c)) then return true end
  local needle = '["' .. t .. '","' .. c .. '",'
  if string.find(j, '{"k":"', 1, true) == 1 then
    local at = string.find(j, needle, 7, true)
    return at ~= nil and string.find(j, '"s":', at - 4, true) ~= at - 4
  end
  local from = string.find(j, '"d":[', 1, true)
  local to = from and string.find(j, '],"s":', from, true)
  if not to then return true end
  local at = string.find(j, needle, from, true)
  return at ~= nil and at < to
end

local function journal(h, j)
  if not j or j == '' then return end
  if h and may_place(j, h[13], h[14]) then
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
  redis.call('XADD', JOURNAL, '*', 'm', j)
end

-- Append item to the list groups[name] (created on first use).
local function group(groups, name, item)
  local list = table_of(groups, name)
  list[#list + 1] = item
end

-- Earlier versions kept one zset of owed conversations per agent (`a:<name>`, the names
-- in the set `ag`, or in a `load` zset before that; an `n` hash of counts too): add
-- their sizes to the load counters and drop them. Two EXISTS when there is nothing to
-- do; O(agents) once otherwise. Counters a newer step already moved stay right: the
-- step changed the counter, not the old index, so the sum is the load.
local function take_over_indices()
  if redis.call('EXISTS', P .. 'ag', P .. 'load') == 0 then return 0 end
  local names = redis.call('SMEMBERS', P .. 'ag')
  for _, who in ipairs(redis.call('ZRANGE', P .. 'load', 0, -1)) do names[#names + 1] = who end
  local moved = 0
  for _, who in ipairs(names) do
    local n = redis.call('ZCARD', P .. 'a:' .. who)
    if n > 0 then
      redis.call('HINCRBY', P .. 'ld', who, n)
      redis.call('DEL', P .. 'a:' .. who)
      moved = moved + 1
    end
  end
  redis.call('DEL', P .. 'ag', P .. 'load', P .. 'n')
  return moved
end
