-- Health of a portalloc.dev PortPool: a pool is ready to allocate from as soon as it exists
-- (its spec is validated by the API server); the message gives its size once its status has
-- been written. Usage is kept per 256-port window in its PortPoolShards, not on the pool
-- (`kubectl portalloc pool get` sums them). Uses only the base library: it also runs from
-- argocd-cm without useOpenLibs.
local hs = {}
hs.status = "Healthy"
hs.message = "PortPool exists"
if obj.status ~= nil then
  local size = obj.status.size
  if type(size) == "number" and size > 0 then
    hs.message = "PortPool of " .. size .. " ports"
  end
end
return hs
