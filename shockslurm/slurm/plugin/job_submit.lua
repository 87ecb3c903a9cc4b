--[[
shockslurm job_submit plugin (Slurm job_submit/lua, Lua 5.1; verified on Slurm 22.05).

GPU jobs submitted to a managed partition are handed to the shockslurm daemon:
  * the comment gains the tag "shock:managed" (the daemon acts only on jobs that carry it),
  * admin_comment records the original request ("shock:req=<tres_per_node or tres_per_job>"),
  * the job is submitted held (priority 0); the daemon releases it when the market gives it GPUs.
Users may still cancel a managed job, but only an operator (uid 0 or SlurmUser) may release it or
change its resources: a user's `scontrol release` / `update Gres=` on a managed job is refused.
CPU-only jobs and jobs of other partitions are untouched.

Edit MANAGED_PARTITIONS for your site; "" stands for jobs that name no partition (the default).
Add the uid of the daemon's dedicated operator user to OPERATOR_UIDS (see README, "Running the
daemon"): Slurm lets it act on others' jobs (AdminLevel=Operator), and this plugin must too.
--]]

local MANAGED_PARTITIONS = { [""] = true, gpu = true }
local OPERATOR_UIDS = { [0] = true, [64030] = true }   -- root, Debian's slurm user (SlurmUser)
local TAG = "shock:managed"

local function wants_gpus(job_desc)
   local per_node = job_desc.tres_per_node or ""
   local per_job = job_desc.tres_per_job or ""
   return string.find(per_node, "gpu", 1, true) ~= nil or string.find(per_job, "gpu", 1, true) ~= nil
end

local function managed_partition(job_desc)
   local part = job_desc.partition or ""
   if part == "" then return MANAGED_PARTITIONS[""] == true end
   for name in string.gmatch(part, "[^,]+") do   -- "-p a,b": every one must be managed
      if not MANAGED_PARTITIONS[name] then return false end
   end
   return true
end

local function is_operator(uid)
   return OPERATOR_UIDS[uid] == true
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if not wants_gpus(job_desc) or not managed_partition(job_desc) then
      return slurm.SUCCESS
   end
   local comment = job_desc.comment or ""
   if string.find(comment, TAG, 1, true) == nil then
      if comment == "" then comment = TAG else comment = comment .. ";" .. TAG end
   end
   job_desc.comment = comment
   job_desc.admin_comment = "shock:req=" .. (job_desc.tres_per_node or job_desc.tres_per_job or "")
   job_desc.priority = 0
   slurm.log_user("shockslurm: job tagged and held for the meta-scheduler")
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   local comment = (job_rec and job_rec.comment) or ""
   if string.find(comment, TAG, 1, true) ~= nil and not is_operator(modify_uid) then
      slurm.log_user("shockslurm: this job is managed by the meta-scheduler; only cancel is allowed")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

slurm.log_info("shock job_submit.lua loaded")
return slurm.SUCCESS
