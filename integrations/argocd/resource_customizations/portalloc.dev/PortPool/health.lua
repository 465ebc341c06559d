-- Health of a portalloc.dev PortPool: a pool is ready to allocate from as soon as it exists
-- (its spec is validated by the API server); the message says how full it is when its status
-- has been written. Uses only the base library: it also runs from argocd-cm without useOpenLibs.
local hs = {}
hs.status = "Healthy"
hs.message = "PortPool exists"
if obj.status ~= nil then
  local size = obj.status.size
  local allocated = obj.status.allocated
  if type(size) == "number" and size > 0 and type(allocated) == "number" then
    hs.message = allocated .. " of " .. size .. " ports allocated"
  end
end
return hs
