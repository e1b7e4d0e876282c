-- Apply one protocol message (or a CLOSE by an operator or the gateway) to one conversation, atomically.
-- KEYS[1] conversation key, KEYS[2] orphan key.
-- ARGV: 1 prefix, 2 type, 3 request id, 4 from, 5 to, 6 depth, 7 max depth,
--   8 response status, 9 priority, 10 task, 11 excerpt, 12 fingerprint, 13 now,
--   14-17 timeouts REQUEST/HANDOFF/CLARIFY/BROADCAST, 18 transport, 19 channel,
--   20 thread, 21 native id, 22 trace id, 23 retention seconds
-- Returns {outcome, reason, previous status, record blob or false}.
local key = KEYS[1]
local typ, id, from, to = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local dc, dm = tonumber(ARGV[6]), tonumber(ARGV[7])
local fp, now = ARGV[12], tonumber(ARGV[13])
local ev = {typ, from, to, dc, dm, '', ARGV[18], ARGV[21], now, ARGV[11], fp}

local blob = redis.call('GET', key)
if not blob then
  if typ == 'REQUEST' or typ == 'BROADCAST' then
    local bc = typ == 'BROADCAST'
    local st = bc and 'done' or 'open'
    local deadline = now + tonumber(bc and ARGV[17] or ARGV[14])
    local h = {ARGV[22], typ, from, to, st, dc, dm, ARGV[9], ARGV[10], now, now, deadline,
               ARGV[18], ARGV[19], ARGV[20], ARGV[21]}
    ev[6] = st
    enter(id, h, now)
    return {'applied', '', false, save(key, h, '', ev)}
  end
  if typ == 'RESPONSE' then
    local okey = KEYS[2]
    local old = redis.call('GET', okey)
    if old and string.find(old, ',"' .. fp .. '"]', 1, true) then
      return {'duplicate', 'this RESPONSE for unknown conversation ' .. id ..
              ' was already kept as an orphan; nothing changed.', false, false}
    end
    ev[6] = 'orphan'
    redis.call('APPEND', okey, cjson.encode(ev) .. '\n')
    redis.call('EXPIRE', okey, math.ceil(tonumber(ARGV[23])))
    if redis.call('ZADD', P .. 'orph', now, id) == 1 then
      redis.call('HINCRBY', P .. 'n', 'orphan', 1)
    end
    return {'orphan', 'no conversation ' .. id .. ' is known here; the RESPONSE from ' .. from ..
            ' was kept as an orphan for review.', false, false}
  end
  local what = typ == 'CLOSE' and 'it cannot be closed' or
      ('a ' .. typ .. ' must follow a REQUEST with that RequestId')
  return {'illegal', 'no conversation ' .. id .. ' is known here; ' .. what .. '.', false, false}
end

if fp ~= '' and string.find(blob, ',"' .. fp .. '"]', 1, true) then
  local h = split(blob)
  return {'duplicate', 'this ' .. typ .. ' was already applied to conversation ' .. id ..
          '; nothing changed.', h[5], blob}
end
local h, body = split(blob)
local st = h[5]
if typ == 'REQUEST' or typ == 'BROADCAST' then
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
  -- An operator's cancel or the gateway's own close: ARGV[8] is the terminal status.
  ev[1] = ARGV[8] == 'cancelled' and 'CANCEL' or 'CLOSE'
  ev[4], ev[5] = h[6], h[7]
  return {'applied', '', st, move(key, id, h, body, ARGV[8], 0, now, ev)}
end
if dc ~= h[6] + 1 or dm ~= h[7] then
  return {'depth', 'conversation ' .. id .. ' is at depth ' .. h[6] .. '/' .. h[7] ..
          ', so its next message must carry depth ' .. (h[6] + 1) .. '/' .. h[7] ..
          ', not ' .. dc .. '/' .. dm .. '.', st, blob}
end
-- On a conversation sent to @all, the first agent other than the requester that
-- speaks for it (CLARIFY or HANDOFF) becomes its assignee.
local holder = h[4]
if string.lower(holder) == 'all' and from ~= h[3] then holder = from end
h[6] = dc

if typ == 'RESPONSE' then
  if st == 'clarifying' and from == h[3] then
    return {'applied', '', st, move(key, id, h, body, 'open', now + tonumber(ARGV[14]), now, ev)}
  end
  local final = ARGV[8]
  if final == '' then final = 'done' end
  return {'applied', '', st, move(key, id, h, body, final, 0, now, ev)}
end
if from ~= holder then
  return {'illegal', 'only ' .. h[4] .. ', who holds conversation ' .. id .. ', may send a ' ..
          typ .. ' on it; ' .. from .. ' does not hold it.', st, blob}
end
if typ == 'CLARIFY' then
  if st == 'clarifying' then
    return {'illegal', 'conversation ' .. id .. ' already waits for ' .. h[3] ..
            ' to answer a question; answer it before asking another.', st, blob}
  end
  return {'applied', '', st,
          move(key, id, h, body, 'clarifying', now + tonumber(ARGV[16]), now, ev, holder)}
end
if typ == 'HANDOFF' then
  return {'applied', '', st,
          move(key, id, h, body, 'handed_off', now + tonumber(ARGV[15]), now, ev, to)}
end
return {'illegal', 'unknown message type ' .. typ .. '.', st, blob}
