--[[
shockslurm job_submit plugin (Slurm job_submit/lua, Lua 5.1; verified on Slurm 22.05.8).

The tag. A job is managed when its comment, split on ';', has a part that equals "shock:managed"
once surrounding ASCII whitespace (space, tab, CR, LF, VT, FF) is stripped: has_managed_tag below,
the same rule as the daemon's (shockslurm/slurm/types.py). The daemon acts only on tagged jobs,
so the plugin makes sure that a job carries the tag exactly when the plugin has held it.

At submit (every user, operators included):
  * A GPU job (tres_per_node or tres_per_job asks for gpu) whose partitions are all managed is
    tagged and held: its comment keeps the user's parts and ends in the exact token
    ";shock:managed" (a tag-like part such as " shock:managed" is replaced by it, so the daemon
    finds the exact token whichever way it strips), admin_comment records the request
    ("shock:req=<tres_per_node or tres_per_job>", and ";shock:nodes=<list>" when the user asked
    for nodes with -w: the daemon's pins replace ReqNodeList, so it is kept where users cannot
    change it, and the daemon never pins such a job), and priority 0 holds it. The daemon
    releases it when the market gives it GPUs.
  * Refused: a GPU job listing managed and unmanaged partitions together (it could run in the
    managed one untagged); a GPU job of a managed partition asking for GPUs per task or per socket
    (--gpus-per-task, --gpus-per-socket: the daemon sizes jobs from per-node or per-job GPUs only);
    any other job whose comment contains the text "shock:managed" anywhere (only the plugin sets
    the tag, and refusing the text, not just the token, leaves no parsing difference between here
    and the daemon that could make the daemon act on a job the plugin never held).
  * Everything else (CPU jobs, GPU jobs of unmanaged partitions) is untouched.

On modify (scontrol update / hold / release, REST updates), by anyone but an operator:
  * A managed (tagged) job: every change is refused, including release, resize, partition and
    comment changes (so the tag cannot be removed). Users can still cancel it.
  * An untagged job: refused when the comment given contains "shock:managed" (the tag cannot be
    added), and refused when the job, as it would be after the change, is a GPU job in a managed
    partition: the fields the change sets (partition, tres_per_node via Gres= or TresPerNode=,
    tres_per_job, tres_per_socket, tres_per_task) override the job's own. This covers a CPU job
    given GPUs, a GPU job moved into a managed partition, and the release of an untagged GPU job
    of a managed partition (e.g. one submitted before this plugin). The user resubmits instead;
    the submit path tags and holds the new job.
  Why refuse rather than tag and hold on modify (both verified on 22.05.8): Slurm refuses a
  user's change of admin_comment ("Attempt to change admin_comment", access denied), and
  _update_job applies fields one by one and keeps the earlier ones when a later one fails
  (e.g. an invalid TresPerJob), so a tag and hold set here could stay on a job whose GPU request
  Slurm then rejected. A refusal from this function comes before any field is applied.
Operators (OPERATOR_UIDS) are not restricted on modify: the daemon releases and resizes jobs.

Fields verified on 22.05.8 in slurm_job_modify: job_desc holds only what the update sets (nil
otherwise): partition, comment, tres_per_node ("gres:gpu:8" for Gres=gpu:8; "gres:" for Gres=,
"" for TresPerNode=), tres_per_job, tres_per_socket, tres_per_task, priority (4294967295 on
release, NO_VAL 4294967294 when not set); job_rec has partition (the resolved one), comment,
admin_comment, the four tres_per_* fields, priority and job_state.

Edit MANAGED_PARTITIONS for your site; "" stands for jobs that name no partition (the default).
Add the uid of the daemon's dedicated operator user to OPERATOR_UIDS (see README, "Running the
daemon"): Slurm lets it act on others' jobs (AdminLevel=Operator), and this plugin must too.
--]]

local MANAGED_PARTITIONS = { [""] = true, gpu = true }
local OPERATOR_UIDS = { [0] = true, [64030] = true }   -- root, Debian's slurm user (SlurmUser)
local TAG = "shock:managed"
local SIZED_GPU_FIELDS = { "tres_per_node", "tres_per_job" }      -- what the daemon sizes jobs by
local UNSIZED_GPU_FIELDS = { "tres_per_socket", "tres_per_task" }
local UPDATABLE_FIELDS = { "partition", "tres_per_node", "tres_per_job", "tres_per_socket",
                           "tres_per_task" }
-- 22.05 defines slurm.ESLURM_ACCESS_DENIED (sbatch/scontrol print "Access/permission denied");
-- a build without it gets the generic error
local REFUSED = slurm.ESLURM_ACCESS_DENIED or slurm.ERROR

local function trim(text)
   return (string.gsub(string.gsub(text, "^[ \t\r\n\v\f]+", ""), "[ \t\r\n\v\f]+$", ""))
end

local function comment_parts(comment)
   local parts = {}
   for part in string.gmatch((comment or "") .. ";", "([^;]*);") do table.insert(parts, part) end
   return parts
end

-- The same rule as the daemon's has_managed_tag (shockslurm/slurm/types.py): the comment split on
-- ';' has a part equal to "shock:managed" once its surrounding whitespace is stripped.
local function has_managed_tag(comment)
   for _, part in ipairs(comment_parts(comment)) do
      if trim(part) == TAG then return true end
   end
   return false
end

local function mentions_tag(comment)
   return comment ~= nil and string.find(comment, TAG, 1, true) ~= nil
end

-- The user's comment parts without any tag-like part, then the exact token.
local function with_tag(comment)
   if comment == nil or comment == "" then return TAG end
   local kept = {}
   for _, part in ipairs(comment_parts(comment)) do
      if trim(part) ~= TAG then table.insert(kept, part) end
   end
   table.insert(kept, TAG)
   return table.concat(kept, ";")
end

local function asks_gpus(job, fields)
   for _, name in ipairs(fields) do
      local value = job[name]
      if value ~= nil and string.find(value, "gpu", 1, true) ~= nil then return true end
   end
   return false
end

local function wants_gpus(job)
   return asks_gpus(job, SIZED_GPU_FIELDS) or asks_gpus(job, UNSIZED_GPU_FIELDS)
end

-- "managed", "unmanaged" or "mixed" for a partition list such as "gpu" or "gpu,urgent".
local function partition_kind(partition)
   local part = partition or ""
   if part == "" then return MANAGED_PARTITIONS[""] and "managed" or "unmanaged" end
   local managed, unmanaged = 0, 0
   for name in string.gmatch(part, "[^,]+") do
      if MANAGED_PARTITIONS[name] then managed = managed + 1 else unmanaged = unmanaged + 1 end
   end
   if managed == 0 then return "unmanaged" end
   if unmanaged == 0 then return "managed" end
   return "mixed"
end

local function is_operator(uid)
   return OPERATOR_UIDS[uid] == true
end

local function refuse(message)
   slurm.log_user("shockslurm: " .. message)
   return REFUSED
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local kind = partition_kind(job_desc.partition)
   if not wants_gpus(job_desc) or kind == "unmanaged" then
      if mentions_tag(job_desc.comment) then
         return refuse("the comment may not contain " .. TAG .. ": the tag is set by the submit "
                       .. "plugin on GPU jobs of managed partitions only")
      end
      return slurm.SUCCESS
   end
   if kind == "mixed" then
      return refuse("a GPU job may not list managed and unmanaged partitions together")
   end
   if asks_gpus(job_desc, UNSIZED_GPU_FIELDS) then
      return refuse("in a managed partition ask for GPUs with --gres=gpu:N, --gpus-per-node or "
                    .. "--gpus, not per task or per socket")
   end
   job_desc.comment = with_tag(job_desc.comment)
   job_desc.admin_comment = "shock:req=" .. (job_desc.tres_per_node or job_desc.tres_per_job or "")
   -- the user's own node list (-w): the daemon's pins replace ReqNodeList, so it is kept here,
   -- where a user cannot change it, and the daemon never pins such a job
   if type(job_desc.req_nodes) == "string" and job_desc.req_nodes ~= "" then
      job_desc.admin_comment = job_desc.admin_comment .. ";shock:nodes=" .. job_desc.req_nodes
   end
   job_desc.priority = 0
   slurm.log_user("shockslurm: job tagged and held for the meta-scheduler")
   return slurm.SUCCESS
end

-- The job as it would be after the update: each field the update sets replaces the job's own.
local function after_modify(job_desc, job_rec)
   local after = {}
   for _, name in ipairs(UPDATABLE_FIELDS) do
      local value = job_desc[name]
      if value == nil then value = job_rec[name] end
      after[name] = value
   end
   return after
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if is_operator(modify_uid) then return slurm.SUCCESS end
   if has_managed_tag(job_rec.comment) then
      return refuse("this job is managed by the meta-scheduler; only cancel is allowed")
   end
   if mentions_tag(job_desc.comment) then
      return refuse("the comment may not contain " .. TAG .. ": the tag is set by the submit "
                    .. "plugin only")
   end
   local after = after_modify(job_desc, job_rec)
   if wants_gpus(after) and partition_kind(after.partition) ~= "unmanaged" then
      return refuse("this change would run a GPU job in a managed partition outside the "
                    .. "meta-scheduler; submit a new job instead (it is tagged and held)")
   end
   return slurm.SUCCESS
end

slurm.log_info("shock job_submit.lua loaded")
return slurm.SUCCESS
