-- Apply a batch of protocol messages (or CLOSEs by an operator or the gateway), each to
-- its conversation, in order, atomically: the whole batch is one step on the server.
-- ARGV[1] prefix, ARGV[2] the store's timeouts and retention (below), then four per
-- message: one JSON array of its fields
-- (one argument instead of 19 keeps the client's encoding cheap), its outbox journal
-- entry ("" = none), its loop guard ("" = none; it also tells how many budget keys the
-- message has) and, for a REQUEST or BROADCAST, the
-- record it opens its conversation with, as encode() writes it from those fields ("" =
-- encode it here; the client writes it, which costs it less than encoding costs the
-- script; fields 5, 6 and 12, read only to encode a record or for a step on a stored
-- conversation, are then false, which cjson reads without making a string or a number
-- (depths were two numbers to parse), field 11 is the text of field 8, the time (the new
-- conversation's index scores: a number passed to redis.call is formatted again each
-- time), and 17-19 are left out: cjson grows the array a slot at a time, reallocating it
-- at 17); KEYS, message
-- after message: the conversation key, then its budget keys (below). The orphan key of
-- an unknown RequestId (P .. 'o:' .. id, the conversation key's hash tag) is made here
-- when a RESPONSE needs it: every argument costs the server a string to parse, copy into
-- the script and hash, and only a RESPONSE for an unknown conversation reads that key.
-- Fields: 1 type, 2 request id, 3 from, 4 to, 5 depth, 6 max depth, 7 fingerprint, 8 now,
--   9 canonical key of from, 10 canonical key of to (protocol.names.name_key),
--   11 response status, 12 priority, 13 transport, 14 channel, 15 thread, 16 native id,
--   17 task, 18 excerpt, 19 trace id
-- Parties compare by those keys (header fields 17 requester key, 18 assignee key), so
-- @mantis and @Mantis are one agent here exactly as in the gateway.
-- The journal entry is appended when the message is accepted. The loop guard is JSON
-- [limit, window seconds, cooldown seconds, number of budget keys] over the message's
-- budget keys.
-- Returns one reply per message: {outcome, reason, previous status, record blob or
-- false}; outcome 'loop' adds {1 when this message tripped a budget else 0, milliseconds
-- until it lets messages pass}; a message that opened a conversation gets its new record
-- alone (that is {'applied', '', false, record}: no table to build and convert for the
-- usual step); a message whose step failed gets an error reply (the others still run).
-- Commands: one MGET up front reads every budget key of the batch and the record of
-- every message that does not open a conversation; then a new REQUEST is SET NX GET
-- (+ XADD with a journal entry), any later step SET; the indices (status, deadline,
-- load, parties) and the budgets are written once per key for the whole batch at the end
-- (see flush_indices in common.lua): alone, a new REQUEST adds 2 ZADD + HINCRBY + one
-- ZADD per party (2) and a SET per budget; in a batch those are shared.
-- Orphan RESPONSEs kept per unknown RequestId (each event is bounded, their number is not).
local ORPHAN_MAX_BYTES = 16384
-- ARGV[2], JSON: the timeouts of REQUEST, HANDOFF, CLARIFY and BROADCAST and the retention,
-- in seconds. They are the same for every message of a store, so they come once a batch
-- (in each message's fields they cost a decoded number each).
local TIMEOUT_REQUEST, TIMEOUT_HANDOFF, TIMEOUT_CLARIFY, TIMEOUT_BROADCAST, RETENTION =
    unpack(cjson.decode(ARGV[2]))
-- Budget states this batch read or wrote, by key (false: none; as read or as a trip wrote
-- it, its JSON; once a message looked at one not cooling down, decoded: the table charge
-- counts in and budget_json writes out when the batch ends, so a key charged by several
-- messages of a batch is decoded and encoded once), the keys it writes (in order) and
-- each one's milliseconds to live (0 when it is deleted or keeps its expiry).
local BUD, BK, BPX = {}, {}, {}
-- Loop guards decoded in this batch, by their JSON (a gateway sends the same one with
-- every message).
local GUARDS = {}

local function decode_guard(g)
  local decoded = cjson.decode(g)
  GUARDS[g] = decoded
  return decoded
end

-- cjson.decode of a budget's JSON. One being charged (as budget_json writes it) is read
-- with a pattern, which also keeps the text of its window start and previous count (s[5]
-- and s[6]), so budget_json writes them back as they are while they do not change,
-- instead of formatting them again (cjson formats a number with snprintf, about 3,000
-- instructions); the pattern and the numbers converted by arithmetic cost what decoding
-- does (tonumber, a call, costs more).
local function decode_budget(raw)
  local w, c3, c4 = string.match(raw, '^%[0,([^,]+),(%d+),(%d+)%]$')
  if not w then return cjson.decode(raw) end
  return {0, w + 0, c3 + 0, c4 + 0, w, c3}
end

-- cjson.encode(s) of a budget being charged (not blocked: s[1] is 0; the counts s[3] and
-- s[4] are whole numbers), the same JSON written out.
local function budget_json(s)
  if s[6] then return '[0,' .. s[5] .. ',' .. s[6] .. string.format(',%d]', s[4]) end
  return '[0,' .. json(s[2]) .. string.format(',%d,%d]', s[3], s[4])
end

local function budget_write(k, state, px)
  if BPX[k] == nil then BK[#BK + 1] = k end
  BUD[k] = state or false
  BPX[k] = px or 0
end

-- The stored record of `key` (false when there is none), read once per batch (REC holds
-- what the batch read up front).
local function stored(key)
  local read = REC[key]
  if read == nil then
    read = redis.call('GET', key)
    REC[key] = read
  end
  return read
end

-- An accepted step: journal its outbound messages (entry j) with it, then answer.
local function accept(st, blob, h, j)
  journal(h, j)
  return {'applied', '', st, blob}
end

-- The orphan RESPONSEs kept for unknown RequestId `id` (state.store.Keys.orphan).
local function orphan_key(id)
  return P .. 'o:' .. id
end

-- The reply for message `a` (its fields) when it was already accepted (its fingerprint is
-- in the record `blob`, or among the orphans kept for an unknown id), else nil.
local function duplicate(a, blob)
  local typ, id, fp = a[1], a[2], a[7]
  if fp == '' then return nil end
  local needle = ',"' .. fp .. '"]'
  if blob then
    -- In the events only (a header's party key could look like a fingerprint).
    if string.find(blob, needle, string.find(blob, '\n', 1, true), true) then
      return {'duplicate', 'this ' .. typ .. ' was already applied to conversation ' .. id ..
              '; nothing changed.', split(blob)[5], blob}
    end
  elseif typ == 'RESPONSE' then
    local old = redis.call('GET', orphan_key(id))
    if old and string.find(old, needle, 1, true) then
      return {'duplicate', 'this RESPONSE for unknown conversation ' .. id ..
              ' was already kept as an orphan; nothing changed.', false, false}
    end
  end
  return nil
end

-- Loop guard (docs/gateway.md, "Loop guards"), shared by every replica because it lives
-- here. Each budget key holds the JSON array [blocked until, window start, previous
-- window's count, this window's count]: a sliding-window counter, O(1) however large the
-- limit, which estimates the messages of the last `window` seconds as this window's count
-- plus the previous window's weighted by how much of it still overlaps. A message passes
-- when every key has room and then counts against each; the message that finds a key
-- full starts that key's cooldown (a fresh window follows it) and is the one reported as
-- tripping it. Keys expire once their windows or cooldown have passed.
-- Message `g` (its guard's JSON, "" for none) at `now` with budget keys KEYS[b + 1] ..
-- KEYS[b + nb]. Returns nil without a guard, else the state of each key not cooling down
-- (guard[i] for key i; guard[-i] true when this message found it full) with what refuses
-- the message (guard.refused, nil when it passes), and the decoded guard. A state is
-- changed in place only by charge (the batch's state of the key): one this message would
-- move to a later window is a copy. One table and numeric loops: allocations and iterator
-- calls are a large part of a step's cost.
local function budgets(g, b, nb, now)
  if g == '' then return nil end
  g = GUARDS[g] or decode_guard(g)
  local limit, window, cooldown = g[1], g[2], g[3]
  -- (Made with room for two keys, a gateway's pair and identity budgets: a table grown
  -- one key at a time is reallocated at each.)
  local guard = {false, false}
  for i = 1, nb do
    local key = KEYS[b + i]
    local s = BUD[key]
    if type(s) == 'string' then
      s = decode_budget(s)
      if s[1] == 0 then BUD[key] = s end  -- (one cooling down stays as written)
    end
    local v
    if s and s[1] > now then
      v = {0, s[1] - now}
    else
      -- New, or its cooldown is over. A window start computed here is kept as its JSON
      -- reads back (as if written and read again between messages).
      if not s or s[1] > 0 then s = {0, json(now) + 0, 0, 0} end
      local d = (now - s[2]) / window
      if d >= 1 then  -- move on by whole windows (their stored text is out of date)
        local k = math.floor(d)
        s = {0, json(s[2] + k * window) + 0, k == 1 and s[4] or 0, 0}
      end
      guard[i] = s
      if s[3] * (1 - (now - s[2]) / window) + s[4] >= limit then
        v = {1, cooldown}
        guard[-i] = true
      end
    end
    -- Report a trip first (one notice per cooldown), else the longest wait.
    local r = guard.refused
    if v and (not r or v[1] > r[1] or (v[1] == r[1] and v[2] > r[2])) then guard.refused = v end
  end
  return guard, g
end

-- Start the cooldown of every budget this message found full (`guard` and the decoded
-- guard `g` as budgets returned them, its keys and time as given to it).
local function trip(guard, g, b, nb, now)
  local cooldown = g[3]
  for i = 1, nb do
    if guard[-i] then
      if cooldown > 0 then
        budget_write(KEYS[b + i], cjson.encode({now + cooldown}), math.ceil(cooldown * 1000))
      else
        budget_write(KEYS[b + i], false)
      end
    end
  end
end

-- Whether state s is among guard[1] .. guard[i - 1].
local function once(guard, s, i)
  for j = 1, i - 1 do
    if guard[j] == s then return true end
  end
  return false
end

-- Count this message against every budget (arguments as for trip); a key lives until its
-- next window ends.
local function charge(guard, g, b, nb, now)
  local window = g[2]
  for i = 1, nb do
    local s = guard[i]
    -- (A key listed twice gets one count, as when each had its copy of the state.)
    if s and not (i > 1 and once(guard, s, i)) then
      s[4] = s[4] + 1
      -- (budget_write, inline: this runs per message and key. One in the window it was
      -- read in keeps its expiry: see the end of the script.)
      local k = KEYS[b + i]
      if BPX[k] == nil then BK[#BK + 1] = k end
      BUD[k] = s
      BPX[k] = s[5] and 0 or math.ceil((s[2] + 2 * window - now) * 1000)
    end
  end
end

-- The event message `a` (its fields) adds to its conversation, with status `st`
-- (made only when a record is encoded here: a new record usually comes written).
local function event(a, st)
  return {a[1], a[3], a[4], a[5], a[6], st, a[13], a[16], a[8], a[18], a[7]}
end

-- The state machine proper for message `a` (its fields) with conversation key `key`,
-- journal entry `j` and new record `rec`: the checks and the transition (one return per
-- outcome).
local function step(key, a, j, rec)
  local typ, id, from, to = a[1], a[2], a[3], a[4]
  local fk = a[9]
  local dc, dm = a[5], a[6]
  local now = a[8]
  local opens = typ == 'REQUEST' or typ == 'BROADCAST'
  local blob
  if opens then
    -- Write the new record only if the id is free; otherwise SET ... GET hands back the
    -- stored one for the checks below (duplicate, conflict), so a REQUEST costs no GET.
    local bc = typ == 'BROADCAST'
    local st = bc and 'done' or 'open'
    local deadline = now + (bc and TIMEOUT_BROADCAST or TIMEOUT_REQUEST)
    local tk = a[10]
    local new = rec
    if new == '' then
      new = encode({a[19], typ, from, to, st, dc, dm, a[12], a[17], now, now, deadline, a[13],
                    a[14], a[15], a[16], fk, tk, (tk ~= fk and tk ~= 'all') and {fk, tk} or {fk},
                    1}, '', event(a, st))
    end
    -- An earlier message of this batch may have written or read the record already.
    blob = REC[key]
    if not blob then blob = redis.call('SET', key, new, 'NX', 'GET') end
    REC[key] = blob or new
    if not blob then
      enter(id, typ, st, rec == '' and now or a[11], deadline, fk, tk)
      journal(a, j)  -- (fields 13-16, the origin, are the new header's 13-16)
      return new
    end
  else
    blob = stored(key)
  end
  local ev = event(a, '')

  if not blob then
    if typ == 'RESPONSE' then
      local dup = duplicate(a, nil)
      if dup then return dup end
      local okey = orphan_key(id)
      local kept = redis.call('STRLEN', okey)
      if kept >= ORPHAN_MAX_BYTES then
        return {'too_long', kept .. ' bytes of orphan RESPONSEs for unknown conversation ' ..
                id .. ' are kept already (at most ' .. ORPHAN_MAX_BYTES .. '); this one was ' ..
                'not kept.', false, false}
      end
      ev[6] = 'orphan'
      redis.call('APPEND', okey, cjson.encode(ev) .. '\n')
      redis.call('EXPIRE', okey, math.ceil(RETENTION))
      zput(P .. 'orph', id, now)
      journal(nil, j)
      return {'orphan', 'no conversation ' .. id .. ' is known here; the RESPONSE from ' ..
              from ..
              ' was kept as an orphan for review.', false, false}
    end
    local what = typ == 'CLOSE' and 'it cannot be closed' or
        ('a ' .. typ .. ' must follow a REQUEST with that RequestId')
    return {'illegal', 'no conversation ' .. id .. ' is known here; ' .. what .. '.', false,
            false}
  end

  local dup = duplicate(a, blob)
  if dup then return dup end
  local h, body = split(blob)
  local st = h[5]
  local rk = h[17]
  if opens then
    return {'conflict', 'RequestId ' .. id .. ' is already used by a conversation ' .. h[3] ..
            ' opened (now ' .. st .. '); send the new ' .. typ .. ' with a fresh RequestId.',
            st, blob}
  end
  if h[2] == 'BROADCAST' then
    return {'illegal', id .. ' is a BROADCAST, which takes no ' .. typ ..
            '; send a REQUEST to ask something.', st, blob}
  end
  if not ACTIVE[st] then
    return {'illegal', 'conversation ' .. id .. ' is already ' .. st ..
            '; it takes no more messages. Open a new REQUEST to continue.', st, blob}
  end
  if typ == 'CLOSE' then
    -- An operator's cancel or the gateway's own close: field 11 is the terminal status.
    ev[1] = a[11] == 'cancelled' and 'CANCEL' or 'CLOSE'
    ev[4], ev[5] = h[6], h[7]
    return accept(st, move(key, id, h, body, a[11], 0, now, ev), h, j)
  end
  -- On a conversation sent to @all, the first agent other than the requester that
  -- speaks for it (CLARIFY, HANDOFF or the answer) becomes its assignee.
  local holder, hk = h[4], h[18]
  if hk == 'all' and fk ~= rk then holder, hk = from, fk end
  -- Only the parties may move a conversation: its holder, and for a RESPONSE also its
  -- requester (answering a CLARIFY, or ending its own request). Checked before the depth,
  -- so a bystander's message can never count as the conversation's depth violation.
  if typ == 'RESPONSE' then
    if fk ~= hk and fk ~= rk then
      return {'illegal', 'only ' .. h[4] .. ', who holds conversation ' .. id .. ', or its ' ..
              'requester ' .. h[3] .. ' may answer it; ' .. from .. ' is neither.', st, blob}
    end
  elseif fk ~= hk then
    return {'illegal', 'only ' .. h[4] .. ', who holds conversation ' .. id .. ', may send a ' ..
            typ .. ' on it; ' .. from .. ' does not hold it.', st, blob}
  end
  if dc ~= h[6] + 1 or dm ~= h[7] then
    return {'depth', 'conversation ' .. id .. ' is at depth ' .. h[6] .. '/' .. h[7] ..
            ', so its next message must carry depth ' .. (h[6] + 1) .. '/' .. h[7] ..
            ', not ' .. dc .. '/' .. dm .. '.', st, blob}
  end
  h[6] = dc
  -- Whoever speaks on a conversation and whoever it is addressed to are its parties (a
  -- HANDOFF's new assignee, the agent taking a request to @all). Records written before
  -- the party index start theirs here with the requester and the assignee.
  if not h[19] then
    h[19] = {}
    party(id, h, rk)
    party(id, h, h[18])
  end
  party(id, h, fk)
  party(id, h, a[10])

  if typ == 'RESPONSE' then
    if st == 'clarifying' and fk == rk then
      return accept(st, move(key, id, h, body, 'open', now + TIMEOUT_REQUEST, now, ev), h, j)
    end
    local final = a[11]
    if final == '' then final = 'done' end
    return accept(st, move(key, id, h, body, final, 0, now, ev), h, j)
  end
  if typ == 'CLARIFY' then
    if st == 'clarifying' then
      return {'illegal', 'conversation ' .. id .. ' already waits for ' .. h[3] ..
              ' to answer a question; answer it before asking another.', st, blob}
    end
    return accept(st, move(key, id, h, body, 'clarifying', now + TIMEOUT_CLARIFY, now, ev,
                           holder, hk), h, j)
  end
  if typ == 'HANDOFF' then
    return accept(st, move(key, id, h, body, 'handed_off', now + TIMEOUT_HANDOFF, now, ev,
                           to, a[10]), h, j)
  end
  return {'illegal', 'unknown message type ' .. typ .. '.', st, blob}
end

-- Apply one message: its conversation key is KEYS[f], its `nb` budget keys follow it,
-- `a` its fields, `j` its journal entry, `g` its guard, `rec` its new record. The steps
-- are functions of the script, not closures made for every message (a closure and its
-- upvalues are allocations: they were about 3% of the script's instructions).
local function apply_one(f, nb, a, j, g, rec)
  local key, b, now = KEYS[f], f, a[8]  -- budget key i is KEYS[b + i]
  local guard, decoded = budgets(g, b, nb, now)
  if guard and guard.refused then
    -- A message already accepted is a duplicate, not a loop: retries never use the budget.
    local dup = duplicate(a, stored(key))
    if dup then return dup end
    trip(guard, decoded, b, nb, now)
    return {'loop', '', false, false, guard.refused[1], math.ceil(guard.refused[2] * 1000)}
  end
  local result = step(key, a, j, rec)
  -- (A new conversation's reply is its record, not a table: it was applied.)
  if guard and (type(result) ~= 'table' or result[1] ~= 'duplicate') then
    charge(guard, decoded, b, nb, now)
  end
  return result
end

-- The batch: its messages (the n-th: fields A[n], its conversation key then C[n] budget
-- keys, as many as its guard names, after the earlier messages' keys; no table per
-- message), then one MGET of what they read (budgets, later steps' records).
local A, C, reads, seen = {}, {}, {}, {}
local k, n = 1, 0
for i = 3, #ARGV, 4 do
  local g = ARGV[i + 2]
  local nb = 0
  if g ~= '' then nb = (GUARDS[g] or decode_guard(g))[4] end
  local a = cjson.decode(ARGV[i])
  n = n + 1
  A[n], C[n] = a, nb
  -- seen[key] is the table its value goes to (records and budgets differ in prefix).
  local key = KEYS[k]
  if a[1] ~= 'REQUEST' and a[1] ~= 'BROADCAST' and not seen[key] then
    seen[key] = REC
    reads[#reads + 1] = key
  end
  for x = k + 1, k + nb do
    local bk = KEYS[x]
    if not seen[bk] then
      seen[bk] = BUD
      reads[#reads + 1] = bk
    end
  end
  k = k + 1 + nb
end
local got = {}
if #reads <= 1000 then  -- (the usual batch: its MGET's reply as it is, not copied)
  if #reads > 0 then got = redis.call('MGET', unpack(reads)) end
else
  sliced(reads, function(...)
    for _, v in ipairs(redis.call('MGET', ...)) do got[#got + 1] = v end
  end)
end
for i = 1, #reads do  -- (numeric loops: ipairs calls a C function per item)
  local rk = reads[i]
  seen[rk][rk] = got[i]
end

local out = {}
k = 1  -- message n's conversation key
for n = 1, #A do
  local i = 4 * n - 1  -- message n's first argument (its fields)
  local ok, res = pcall(apply_one, k, C[n], A[n], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
  if not ok then
    res = redis.error_reply(type(res) == 'table' and res.err or tostring(res))
  end
  out[n] = res
  k = k + 1 + C[n]
end
flush_indices()
-- A budget still in the window it was read in (its stored start, s[5], kept) expires when
-- it was set to, at the end of the window after it: KEEPTTL spares the expiry's arithmetic
-- and Valkey's conversion of PX to the PXAT it writes to the append-only file. On Valkey
-- 9.1 and later those are written together, with one MSETEX ... KEEPTTL (the same writes:
-- each key keeps its own expiry), instead of a SET each: a command called from a script
-- costs several thousand instructions besides its own work (its arguments converted, its
-- reply converted back, its entry in the append-only file). Elsewhere, a SET each.
local MSETEX = (tonumber(redis.VALKEY_VERSION_NUM) or 0) >= 0x090100
local kept, nk = {}, 0  -- MSETEX's arguments from kept[2]: key, value, ...
-- Write the nk budgets gathered in kept with one MSETEX (their count first, KEEPTTL last).
local function write_kept()
  kept[1], kept[2 * nk + 2] = nk, 'KEEPTTL'
  redis.call('MSETEX', unpack(kept, 1, 2 * nk + 2))
  nk = 0
end
for i = 1, #BK do
  local bk = BK[i]
  local s = BUD[bk]
  if type(s) == 'table' then
    if s[5] and MSETEX then
      kept[2 * nk + 2] = bk
      kept[2 * nk + 3] = budget_json(s)
      nk = nk + 1
      if nk == 500 then write_kept() end  -- (Lua's unpack takes a few thousand values)
    elseif s[5] then
      redis.call('SET', bk, budget_json(s), 'KEEPTTL')
    else
      redis.call('SET', bk, budget_json(s), 'PX', BPX[bk])
    end
  elseif s then
    redis.call('SET', bk, s, 'PX', BPX[bk])
  else
    redis.call('DEL', bk)
  end
end
if nk > 0 then write_kept() end
return out
