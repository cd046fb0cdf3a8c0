-- Renews a process's leases on one or more lease sets, in one call.
--
-- KEYS:    the lease sets (on Redis Cluster, all in one hash slot: the
--          caller sends one key per call there, unless the limiter's
--          names share a hash tag).
-- ARGV[1]: the lease time in milliseconds.
-- then, for each key in order: the number n of its leases to renew, and
--          their n ids.
--
-- The clock is Redis's TIME, as in acquire.lua. Expired leases are
-- dropped first (they are gone: a lease that expired is never revived,
-- since its place may have been taken); each id still present gets the
-- expiry now + lease time, and the set's expiry follows its last lease.
--
-- Returns {now_ms, then the 1-based positions (over all the ids of the
-- call, in order) of the leases that were not there: lost}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local reply = {now}
local a = 2
local position = 0
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  a = a + 1
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local kept = 0
  for _ = 1, n do
    position = position + 1
    local id = ARGV[a]
    a = a + 1
    if redis.call('ZSCORE', key, id) then
      redis.call('ZADD', key, 'XX', expiry, id)
      kept = kept + 1
    else
      reply[#reply + 1] = position
    end
  end
  if kept > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, last[2])
  end
end
return reply
