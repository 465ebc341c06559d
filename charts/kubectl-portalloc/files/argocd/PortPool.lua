-- Health of a portalloc.dev PortPool: a pool is ready to allocate from as soon as it exists
-- (its spec is validated by the API server), full or not: a PortAllocation it cannot serve is
-- Degraded itself. The message gives its size once its status has been written, and its usage
-- as the in-cluster watcher (sync --watch) last counted it from the PortPoolShards, with when.
-- While its Overlap condition is True (it shares ports with another pool of its protocol,
-- written before the overlap admission policy) the message says so first; still Healthy, as
-- Flux's kstatus, which knows no such condition, says Current.
-- Uses only the base library: it also runs from argocd-cm without useOpenLibs.
local hs = {}
hs.status = "Healthy"
hs.message = "PortPool exists"
if obj.status ~= nil then
  local size = obj.status.size
  if type(size) == "number" and size > 0 then
    hs.message = "PortPool of " .. size .. " ports"
  end
  local usage = obj.status.usage
  if type(usage) == "table" and type(usage.allocated) == "number" and type(usage.free) == "number" then
    hs.message = hs.message .. ": " .. usage.allocated .. " allocated, " .. usage.free .. " free"
    if type(usage.largestFreeRun) == "number" then
      hs.message = hs.message .. " (largest free run " .. usage.largestFreeRun .. ")"
    end
    if type(usage.countedAt) == "string" then
      hs.message = hs.message .. ", counted at " .. usage.countedAt
    end
  end
  if type(obj.status.conditions) == "table" then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == "Overlap" and c.status == "True" then
        hs.message = "PortPool " .. c.message .. " (change the ranges of one of them); " .. hs.message
      end
    end
  end
end
return hs
