-- Apply one protocol message (or a CLOSE by an operator or the gateway) to one conversation, atomically.
-- KEYS[1] conversation key, KEYS[2] orphan key.
-- ARGV[1] prefix; ARGV[2] one JSON array (one argument instead of 22 keeps the client's
--   encoding cheap): 1 type, 2 request id, 3 from, 4 to, 5 depth, 6 max depth,
--   7 response status, 8 priority, 9 task, 10 excerpt, 11 fingerprint, 12 now,
--   13 transport, 14 channel, 15 thread, 16 native id, 17 trace id,
--   18-21 timeouts REQUEST/HANDOFF/CLARIFY/BROADCAST, 22 retention seconds,
--   23 canonical key of from, 24 canonical key of to (protocol.names.name_key)
-- Parties compare by those keys (header fields 17 requester key, 18 assignee key), so
-- @mantis and @Mantis are one agent here exactly as in the gateway.
--   ARGV[3] the outbox journal entry to append when the message is accepted ("" = none).
--   ARGV[4] (optional) the loop guard: JSON [limit, window seconds, cooldown seconds],
--   KEYS[3..] its budget keys (see budgets below).
-- Returns {outcome, reason, previous status, record blob or false}; outcome 'loop' adds
-- {1 when this message tripped a budget else 0, milliseconds until it lets messages pass}.
-- Commands: a new REQUEST is SET NX GET + 2 ZADD + HINCRBY + one ZADD per party (2); any
-- later step is GET + SET plus only the indices that change (see reindex in common.lua)
-- and a ZADD for a new party; the loop guard adds an MGET of its keys (which reads the
-- record of a later step too, instead of its GET) and a SET per key.
local key = KEYS[1]
-- Orphan RESPONSEs kept per unknown RequestId (each event is bounded, their number is not).
local ORPHAN_MAX_BYTES = 16384
local a = cjson.decode(ARGV[2])
local typ, id, from, to = a[1], a[2], a[3], a[4]
local fk = a[23]
local dc, dm = a[5], a[6]
local fp, now = a[11], a[12]
local ev = {typ, from, to, dc, dm, '', a[13], a[16], now, a[10], fp}
local opens = typ == 'REQUEST' or typ == 'BROADCAST'
-- The stored record when it was read already (with the budgets), else nil.
local read = nil

-- The stored record (false when there is none), read once.
local function stored()
  if read == nil then read = redis.call('GET', key) end
  return read
end

-- An accepted step: journal its outbound messages with it, then answer.
local function accept(st, blob, h)
  journal(h)
  return {'applied', '', st, blob}
end

-- The reply for a message already accepted (its fingerprint is in the record `blob`, or
-- among the orphans kept for an unknown id), else nil.
local function duplicate(blob)
  if fp == '' then return nil end
  local needle = ',"' .. fp .. '"]'
  if blob then
    -- In the events only (a header's party key could look like a fingerprint).
    if string.find(blob, needle, string.find(blob, '\n', 1, true), true) then
      return {'duplicate', 'this ' .. typ .. ' was already applied to conversation ' .. id ..
              '; nothing changed.', split(blob)[5], blob}
    end
  elseif typ == 'RESPONSE' then
    local old = redis.call('GET', KEYS[2])
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
local function budgets()
  local g = ARGV[4]
  if not g or g == '' then return nil end
  g = cjson.decode(g)
  local limit, window, cooldown = g[1], g[2], g[3]
  local guard = {states = {}, tripped = {}, window = window, cooldown = cooldown}
  -- A later step reads its record in the same MGET (a new one is SET NX GET instead).
  local skip = 2
  local raws
  if opens then
    raws = redis.call('MGET', unpack(KEYS, 3))
  else
    raws = redis.call('MGET', key, unpack(KEYS, 3))
    read = raws[1]
    skip = 1
  end
  for i = 3, #KEYS do
    local raw = raws[i - skip]
    local s = raw and cjson.decode(raw)
    local v
    if s and s[1] > now then
      v = {0, s[1] - now}
    else
      if not s or s[1] > 0 then s = {0, now, 0, 0} end  -- new, or its cooldown is over
      local k = math.floor((now - s[2]) / window)
      if k >= 1 then  -- move on by whole windows
        s[3] = k == 1 and s[4] or 0
        s[4] = 0
        s[2] = s[2] + k * window
      end
      guard.states[i] = s
      if s[3] * (1 - (now - s[2]) / window) + s[4] >= limit then
        v = {1, cooldown}
        guard.tripped[i] = true
      end
    end
    -- Report a trip first (one notice per cooldown), else the longest wait.
    local r = guard.refused
    if v and (not r or v[1] > r[1] or (v[1] == r[1] and v[2] > r[2])) then guard.refused = v end
  end
  return guard
end

-- Start the cooldown of every budget this message found full.
local function trip(guard)
  for i in pairs(guard.tripped) do
    if guard.cooldown > 0 then
      redis.call('SET', KEYS[i], cjson.encode({now + guard.cooldown}), 'PX',
                 math.ceil(guard.cooldown * 1000))
    else
      redis.call('DEL', KEYS[i])
    end
  end
end

-- Count this message against every budget; a key lives until its next window ends.
local function charge(guard)
  for i, s in pairs(guard.states) do
    s[4] = s[4] + 1
    redis.call('SET', KEYS[i], cjson.encode(s), 'PX',
               math.ceil((s[2] + 2 * guard.window - now) * 1000))
  end
end

-- The state machine proper: the checks and the transition (one return per outcome).
local function step()
  local blob
  if opens then
    -- Write the new record only if the id is free; otherwise SET ... GET hands back the
    -- stored one for the checks below (duplicate, conflict), so a REQUEST costs no GET.
    local bc = typ == 'BROADCAST'
    local st = bc and 'done' or 'open'
    local h = {a[17], typ, from, to, st, dc, dm, a[8], a[9], now, now,
               now + (bc and a[21] or a[18]), a[13], a[14], a[15], a[16], fk, a[24], {fk}, 1}
    if a[24] ~= fk and a[24] ~= 'all' then h[19][2] = a[24] end
    ev[6] = st
    local new = encode(h, '', ev)
    blob = redis.call('SET', key, new, 'NX', 'GET')
    if not blob then
      enter(id, h)
      journal(h)
      return {'applied', '', false, new}
    end
  else
    blob = stored()
  end

  if not blob then
    if typ == 'RESPONSE' then
      local okey = KEYS[2]
      local dup = duplicate(nil)
      if dup then return dup end
      local kept = redis.call('STRLEN', okey)
      if kept >= ORPHAN_MAX_BYTES then
        return {'too_long', kept .. ' bytes of orphan RESPONSEs for unknown conversation ' ..
                id .. ' are kept already (at most ' .. ORPHAN_MAX_BYTES .. '); this one was ' ..
                'not kept.', false, false}
      end
      ev[6] = 'orphan'
      redis.call('APPEND', okey, cjson.encode(ev) .. '\n')
      redis.call('EXPIRE', okey, math.ceil(a[22]))
      redis.call('ZADD', P .. 'orph', now, id)
      journal(nil)
      return {'orphan', 'no conversation ' .. id .. ' is known here; the RESPONSE from ' .. from ..
              ' was kept as an orphan for review.', false, false}
    end
    local what = typ == 'CLOSE' and 'it cannot be closed' or
        ('a ' .. typ .. ' must follow a REQUEST with that RequestId')
    return {'illegal', 'no conversation ' .. id .. ' is known here; ' .. what .. '.', false, false}
  end

  local dup = duplicate(blob)
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
    -- An operator's cancel or the gateway's own close: field 7 is the terminal status.
    ev[1] = a[7] == 'cancelled' and 'CANCEL' or 'CLOSE'
    ev[4], ev[5] = h[6], h[7]
    return accept(st, move(key, id, h, body, a[7], 0, now, ev), h)
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
  party(id, h, a[24])

  if typ == 'RESPONSE' then
    if st == 'clarifying' and fk == rk then
      return accept(st, move(key, id, h, body, 'open', now + a[18], now, ev), h)
    end
    local final = a[7]
    if final == '' then final = 'done' end
    return accept(st, move(key, id, h, body, final, 0, now, ev), h)
  end
  if typ == 'CLARIFY' then
    if st == 'clarifying' then
      return {'illegal', 'conversation ' .. id .. ' already waits for ' .. h[3] ..
              ' to answer a question; answer it before asking another.', st, blob}
    end
    return accept(st, move(key, id, h, body, 'clarifying', now + a[20], now, ev, holder, hk), h)
  end
  if typ == 'HANDOFF' then
    return accept(st, move(key, id, h, body, 'handed_off', now + a[19], now, ev, to, a[24]), h)
  end
  return {'illegal', 'unknown message type ' .. typ .. '.', st, blob}
end

local guard = budgets()
if guard and guard.refused then
  -- A message already accepted is a duplicate, not a loop: retries never use the budget.
  local dup = duplicate(stored())
  if dup then return dup end
  trip(guard)
  return {'loop', '', false, false, guard.refused[1], math.ceil(guard.refused[2] * 1000)}
end
local result = step()
if guard and result[1] ~= 'duplicate' then charge(guard) end
return result
