-- Health of a portalloc.dev PortAllocation, from its kstatus-style status: observedGeneration
-- and the Ready, Reconciling and Stalled conditions. Ports are allocated client-side by
-- `kubectl portalloc sync` (or its watcher), so an object nobody has synced yet is Progressing.
-- Uses only the base and table libraries: it also runs from argocd-cm without useOpenLibs.
local hs = {}
local waiting = "Waiting for kubectl portalloc sync"

local function condition(conditionType)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function messageOf(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = waiting .. ": no ports allocated yet"
  return hs
end

-- A status written for an older spec says nothing about the current one, whatever its
-- conditions (kstatus checks the generation first too).
local observed = nil
if type(obj.status.observedGeneration) == "number" then
  observed = obj.status.observedGeneration
end
local generation = obj.metadata.generation
if observed ~= nil and type(generation) == "number" and observed < generation then
  hs.status = "Progressing"
  if observed == 0 then
    hs.message = waiting .. ": no ports allocated yet"
  else
    hs.message = waiting .. ": spec generation " .. generation .. " not yet allocated (status is for generation " .. observed .. ")"
  end
  return hs
end

-- A durable failure (PoolFull, PortHeld, PoolNotFound, InvalidSpec, InvalidPool): the condition
-- says what failed and what to do.
local stalled = condition("Stalled")
if isTrue(stalled) then
  hs.status = "Degraded"
  hs.message = messageOf(stalled, "Allocation failed")
  return hs
end

if observed == nil or observed == 0 then
  hs.status = "Progressing"
  hs.message = waiting .. ": no ports allocated yet"
  return hs
end

local ready = condition("Ready")
if isTrue(ready) then
  hs.status = "Healthy"
  hs.message = messageOf(ready, "All ports allocated")
  return hs
end

hs.status = "Progressing"
local reconciling = condition("Reconciling")
if isTrue(reconciling) then
  hs.message = messageOf(reconciling, waiting)
else
  hs.message = messageOf(ready, waiting)
end
return hs
