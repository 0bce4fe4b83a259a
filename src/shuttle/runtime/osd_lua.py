"""The Lua that runs inside a Ceph OSD (``cls_lua``): grep and count over one slice.

Each call reads one slice ``[offset, offset + length)`` of a RADOS object with
``objclass.read`` and answers in a binary frame built with Lua 5.3's ``string.pack``
(the OSD's Lua has no ``cmsgpack``; :mod:`shuttle.runtime.osd` parses the frames with
:mod:`struct`). The handler's whole body runs under ``pcall``: a Lua error comes back
as an ``E`` frame with its message, not as a bare ``EIO`` whose message only the OSD's
log would hold.

Lines are what ``grep`` sees: the text before the slice's first newline (*head*) and
after its last (*tail*) are fragments of lines that continue in the neighbouring
slices; the caller joins them and matches the joined line itself. Only the complete
lines between are matched here. A slice with no newline at all is one fragment.

Patterns are fixed strings (``string.find`` with ``plain = true``: one C search over
the buffer, the fastest way Lua has; a loop over lines was 5× slower). With
``ignore_case`` the caller lowers the pattern and the script lowers the slice, ASCII
only, as Python's ``re.IGNORECASE`` does on bytes.

**Bounds.** Every call is bounded three ways so that it cannot hold its placement
group (the OSD serialises operations per PG) for long, nor overflow the caller's
buffer: the slice length (chosen by the caller), ``out_max`` (the frame never exceeds
it: librados refuses an output longer than the length the caller gave with ERANGE)
and ``steps_max`` (matches examined). Reaching either of the last two ends the call
early with a ``P`` (partial) frame at a line boundary; the caller calls again from
there. One matching line longer than ``out_max`` is an ``L`` frame.

Frames (little-endian; ``s4`` = 4-byte length + bytes)::

    input:  s4 pattern, I8 offset, I8 length, I8 out_max, I8 steps_max, B flags
            (flags: 1 ignore case, 2 collect lines (grep) rather than count them)
    E:      "E" s4 message
    L:      "L" I8 offset of the line, I8 its length
    O / P:  "O"|"P" I8 object size, I8 end (offset scanned to), I8 newlines in
            [offset, end), I8 words, B edges (1: slice starts with a non-space,
            2: ends with one), I8 matches, s4 head, s4 tail, then per collected
            line: I8 newlines before it within the slice, s4 the line
"""

from __future__ import annotations

#: The handler names the scripts register.
HANDLER_SCAN = "shuttle_scan"
HANDLER_RUN = "shuttle_run"

#: grep and count over one slice (see the module docstring for the frames).
SCAN = r"""
local find, sub, gsub = string.find, string.sub, string.gsub
local pack, unpack = string.pack, string.unpack
local FRAME = "<c1I8I8I8I8BI8s4s4"

-- Newlines in s[i..j-1] and the position after the last of them (i if none): a plain
-- find per line (36 ms for 16 MB here; gsub was 211 ms).
local function newlines(s, i, j)
  local n, start = 0, i
  while true do
    local k = find(s, "\n", start, true)
    if not k or k >= j then return n, start end
    n, start = n + 1, k + 1
  end
end

-- The last newline of s (nil if none), searched backwards in growing windows.
local function last_newline(s)
  local n, w = #s, 4096
  while true do
    local from = n - w + 1
    if from < 1 then from = 1 end
    local k = find(string.reverse(sub(s, from)), "\n", 1, true)
    if k then return n - k + 1 end
    if from == 1 then return nil end
    w = w * 16
  end
end

local function words_of(s)
  local _, w = gsub(s, "%S+", "")
  return w
end

local function scan(input, output)
  local pat, off, len, out_max, steps_max, flags = unpack("<s4I8I8I8I8B", input:str())
  local icase, collect = (flags & 1) ~= 0, (flags & 2) ~= 0
  local size = objclass.stat()
  if off >= size then
    output:append(pack(FRAME, "O", size, off, 0, 0, 0, 0, "", ""))
    return
  end
  if off + len > size then len = size - off end
  local d = objclass.read(off, len):str()
  local n = #d
  local s = d
  if icase then s = string.lower(d) end
  -- words, and whether the slice begins/ends inside one: counts only
  local words, edges = 0, 0
  if not collect then
    words = words_of(s)
    if find(s, "^%S") then edges = edges | 1 end
    if find(s, "%S$") then edges = edges | 2 end
  end
  local first = find(s, "\n", 1, true)
  local frag = #pat > 0  -- fragments matter only to match the lines they make
  if not first then
    if not frag then d = "" end
    if #d + 64 > out_max then
      output:append(pack("<c1I8I8", "L", off, n))
      return
    end
    output:append(pack(FRAME, "O", size, off + n, 0, words, edges, 0, d, ""))
    return
  end
  local last = last_newline(s)
  local head, tail = "", ""
  if frag then head, tail = sub(d, 1, first - 1), sub(d, last + 1) end
  local used = 64 + #head + #tail
  if used > out_max then
    output:append(pack("<c1I8I8", "L", off, math.max(#head, #tail)))
    return
  end
  local lines = {}
  local matches, steps = 0, 0
  local nl = 1          -- newlines in s before pos (the first one)
  local pos = first + 1 -- a line start
  local partial = false
  while frag and pos <= last do
    local i = find(s, pat, pos, true)
    if not i or i > last then break end
    steps = steps + 1
    if steps > steps_max then partial = true break end
    local seg_nl, ls = newlines(s, pos, i)
    local le = find(s, "\n", i, true)
    if collect then
      local line = sub(d, ls, le - 1)
      if used + 12 + #line > out_max then
        if matches == 0 then
          output:append(pack("<c1I8I8", "L", off + ls - 1, #line))
          return
        end
        nl = nl + seg_nl
        pos = ls
        partial = true
        break
      end
      used = used + 12 + #line
      lines[#lines + 1] = pack("<I8s4", nl + seg_nl, line)
    end
    matches = matches + 1
    nl = nl + seg_nl + 1
    pos = le + 1
  end
  if partial then
    -- stop at the line start pos: the caller resumes there, so no tail, and words
    -- and edges cover s[1 .. pos-1] only (pos follows a newline: no word straddles)
    local w = 0
    if not collect then w = words_of(sub(s, 1, pos - 1)) end
    output:append(pack(FRAME, "P", size, off + pos - 1, nl, w, edges & 1, matches, head, ""))
  else
    local rest = newlines(s, pos, last + 1)
    nl = nl + rest
    output:append(pack(FRAME, "O", size, off + n, nl, words, edges, matches, head, tail))
  end
  for k = 1, #lines do output:append(lines[k]) end
end

function shuttle_scan(input, output)
  local ok, a, b = pcall(scan, input, output)
  if not ok then
    local msg = b ~= nil and (tostring(b) .. " (errno " .. tostring(a) .. ")") or tostring(a)
    output:append(string.pack("<c1s4", "E", msg))
  end
  return 0
end
objclass.register(shuttle_scan)
"""

#: Any Lua body, loaded with ``load`` and run under ``pcall``: its result (a string) or
#: its error, syntax errors included, come back in a frame (``O`` s4 result, or ``E``).
#: The body sees ``input`` (the caller's bytes) and ``objclass``.
RUN = r"""
function shuttle_run(input, output)
  local args = input:str()
  local body, source = string.unpack("<s4s4", args)
  local chunk, err = load(source, "=body", "t")
  if not chunk then
    output:append(string.pack("<c1s4", "E", "syntax: " .. tostring(err)))
    return 0
  end
  local ok, a, b = pcall(chunk, body)
  if not ok then
    local msg = b ~= nil and (tostring(b) .. " (errno " .. tostring(a) .. ")") or tostring(a)
    output:append(string.pack("<c1s4", "E", msg))
  else
    output:append(string.pack("<c1s4", "O", tostring(a or "")))
  end
  return 0
end
objclass.register(shuttle_run)
"""
