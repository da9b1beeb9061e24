"""The search kernels of the two Sokoban level generators, and the steps they share.

:func:`generate_kernel` is the search of :mod:`ragen_envs.sokoban.generator` (breadth-first reverse play) and
:func:`reference_kernel` the one of :mod:`ragen_envs.sokoban.reference_generator` (the reference's depth-first reverse
play); the generator modules describe what each does. Both start alike, from gym-sokoban's random-walk room with its
targets (:func:`_carve_room`), and both look their search states up in a hash table alike (:func:`_find_state`); the
breadth-first search fills the player's regions with :func:`_fill_region`.

Every function here is written in the subset of Python that numba compiles. With numba installed (the ``fast`` extra)
:class:`~ragen_envs.sokoban.base.KernelGenerator` compiles a kernel once and caches it, after :func:`jit_helpers` has
let numba compile the helpers it calls; without numba the *same* functions run as plain Python on lists and make
identical levels, only slower.

The kernels and their helpers share this one module on purpose: numba checks a cached kernel against its own source
file only, so a helper kept in another file could change while the cached kernel went on running its old code.
"""

from __future__ import annotations

import threading

import numpy as np

# The five 3x3 floor masks of gym-sokoban's random walk, as (row offset, col offset) lists around the walk position.
_MASKS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
# Flattened for the kernels: offsets (dr, dc) per mask, padded to 4 entries, and the count of each.
_MASK_DR = np.array([[dr for dr, _ in m] + [0] * (4 - len(m)) for m in _MASKS], dtype=np.int64).ravel()
_MASK_DC = np.array([[dc for _, dc in m] + [0] * (4 - len(m)) for m in _MASKS], dtype=np.int64).ravel()
_MASK_N = np.array([len(m) for m in _MASKS], dtype=np.int64)
# The walk directions, gym-sokoban's order: down, right, up, left.
_DIR_DR = np.array([1, 0, -1, 0], dtype=np.int64)
_DIR_DC = np.array([0, 1, 0, -1], dtype=np.int64)

# Offsets in the kernels' ``geo`` array (:func:`room_geometry`): the five walk masks (row and column offsets, 4 slots
# each, and their sizes), the walk directions and the reference's pull actions' cell steps (up, down, left, right: its
# actions 0-3; filled per room width).
_G_MASK_DR, _G_MASK_DC, _G_MASK_N, _G_DIR_DR, _G_DIR_DC, _G_ACT = 0, 20, 40, 45, 49, 53

#: A kernel's array argument: a numpy array for numba, a list for the plain-Python backend.
Array = np.ndarray | list

#: The status code of a kernel that made a level; any other code says why it did not (see each kernel).
OK = 0

# Indices of the reference kernel's ``out`` array.
(OUT_PLAYER, OUT_STATES, OUT_SCORE, OUT_DISP, OUT_SWAPS, OUT_WALK, OUT_START, OUT_PULLED, OUT_ROOMS) = range(9)


def room_geometry(cols: int) -> np.ndarray:
    """The kernels' ``geo`` array for rooms ``cols`` cells wide (layout: the ``_G_*`` offsets)."""
    geo = np.concatenate([_MASK_DR, _MASK_DC, _MASK_N, _DIR_DR, _DIR_DC, np.array([-cols, cols, -1, 1])])
    return geo.astype(np.int64)


def generate_uniform_count(num_steps: int, num_boxes: int) -> int:
    """How many uniforms one :func:`generate_kernel` attempt reads (start cell and direction, 3 per walk step,
    targets, salt, player)."""
    return 3 + 3 * num_steps + num_boxes + 2


def reference_uniform_count(num_steps: int, num_boxes: int) -> int:
    """How many uniforms one room of :func:`reference_kernel` reads: walk start and direction (3), 3 per walk step,
    player and targets (``num_boxes + 1``), the walk decision and up to 3 (choice, continue) pairs (7)."""
    return 3 + 3 * num_steps + num_boxes + 1 + 7


_JIT_LOCK = threading.Lock()
_jitted: list[bool] = []  # [True] once the helpers are registered with numba


def jit_helpers(backend: str) -> None:
    """With ``backend="numba"``, let numba compile the helpers the kernels call (once per process; imports numba).

    A generator calls it before its kernel's first call, which compiles the kernel: numba compiles only functions it
    knows, and the plain-Python backend must go on calling the plain ones.
    """
    if backend != "numba":
        return
    with _JIT_LOCK:
        if _jitted:
            return
        from numba.extending import register_jitable  # numba is optional and slow to import: only when used

        for helper in (_carve_room, _fill_region, _find_state):
            register_jitable(helper)  # registers a compiled version for calls from compiled code; returns helper
        _jitted.append(True)


# --------------------------------------------------------------------------------------------- the shared steps
def _carve_room(rows, cols, num_boxes, first, num_steps, p_change, u, geo, fixed, cells, targets):
    """gym-sokoban's room and targets (``room_topology_generation``, ``place_boxes_and_player``) from the uniforms
    ``u``, read from index 0.

    Writes the room into ``fixed`` (flat, ``rows * cols``: 0 wall, 1 floor, 2 target). The walk starts on a random
    cell (rows and columns ``1..dim-1``), turns to a random direction with probability ``p_change``, moves one cell
    (clamped to the interior) and carves one of the five masks at each of its ``num_steps`` steps; the border becomes
    wall. Then ``first + num_boxes`` distinct random floor cells go to the front of ``cells`` (a partial Fisher-Yates
    over the floor list): the first ``first`` are the caller's (the reference's player), the next ``num_boxes`` the
    targets, also written into ``targets`` in ascending order. Returns the index of the first uniform left unread,
    or -1 when the room has ``<= num_boxes + 1`` floor cells.
    """
    ncells = rows * cols
    for i in range(ncells):
        fixed[i] = 0
    k = 0
    r = 1 + int(u[k] * (rows - 1))  # random.randint(1, dim_x - 1): the border row itself is possible
    k += 1
    c = 1 + int(u[k] * (cols - 1))
    k += 1
    d = int(u[k] * 4)
    k += 1
    for _ in range(num_steps):
        if u[k] < p_change:
            d = int(u[k + 1] * 4)
        m = int(u[k + 2] * 5)
        k += 3
        r = max(min(r + geo[_G_DIR_DR + d], rows - 2), 1)
        c = max(min(c + geo[_G_DIR_DC + d], cols - 2), 1)
        for j in range(geo[_G_MASK_N + m]):
            fixed[(r + geo[_G_MASK_DR + m * 4 + j]) * cols + c + geo[_G_MASK_DC + m * 4 + j]] = 1
    nfloor = 0
    for rr in range(rows):
        for cc in range(cols):
            i = rr * cols + cc
            if rr == 0 or cc == 0 or rr == rows - 1 or cc == cols - 1:
                fixed[i] = 0
            elif fixed[i] == 1:
                cells[nfloor] = i
                nfloor += 1
    if nfloor <= num_boxes + 1:
        return -1  # no room for the boxes and the player (place_boxes_and_player's RuntimeError)
    for j in range(first + num_boxes):
        pick = j + int(u[k] * (nfloor - j))
        k += 1
        tmp = cells[j]
        cells[j] = cells[pick]
        cells[pick] = tmp
    # targets ascending: the generator's states keep their box lists sorted so that equal states compare equal, and
    # the reference's box identities are its targets in row-major order (its box_mapping keys, in np.where order)
    for j in range(num_boxes):
        x = cells[first + j]
        b = j - 1
        while b >= 0 and targets[b] > x:
            targets[b + 1] = targets[b]
            b -= 1
        targets[b + 1] = x
    for j in range(num_boxes):
        fixed[targets[j]] = 2
    return k


def _fill_region(start, cols, geo, fixed, occ, ostamp, vis, stamp, stack):
    """Flood-fill the player's region from ``start``: every cell reachable through floor (``fixed != 0``) not holding
    a box (``occ != ostamp``) gets ``vis[cell] = stamp`` (``start`` too). ``stack`` is scratch space for ``rows *
    cols`` cells. Returns the region's smallest cell, which names the region in a search state."""
    top = 0
    stack[top] = start
    top += 1
    vis[start] = stamp
    low = start
    while top > 0:
        top -= 1
        x = stack[top]
        low = min(low, x)
        for dd in range(4):
            y = x + geo[_G_DIR_DR + dd] * cols + geo[_G_DIR_DC + dd]
            if fixed[y] != 0 and occ[y] != ostamp and vis[y] != stamp:
                vis[y] = stamp
                stack[top] = y
                top += 1
    return low


def _find_state(table, tmask, h, players, keys, num_keys, player, key, key_base):
    """Look a search state up in an open-addressing hash ``table`` (0: an empty slot, else 1 + a state's index) by
    its hash ``h``: the state is ``player`` with the keys ``key[key_base : key_base + num_keys]``, and state ``i`` is
    ``players[i]`` with ``keys[i * num_keys : (i + 1) * num_keys]``. Returns ``(slot, found)``: the state's slot, or
    the empty slot where it goes."""
    slot = h & tmask
    while table[slot] != 0:
        other = table[slot] - 1
        if players[other] == player:
            same = True
            ob = other * num_keys
            for t in range(num_keys):
                if keys[ob + t] != key[key_base + t]:
                    same = False
                    break
            if same:
                return slot, True
        slot = (slot + 1) & tmask
    return slot, False


# ---------------------------------------------------------------------------------------- the exact generator's kernel
def generate_kernel(
    rows: int,
    cols: int,
    num_boxes: int,
    num_steps: int,
    p_change: float,
    u: Array,
    max_states: int,
    max_depth: int,
    tsize: int,
    geo: Array,
    zob_box: Array,
    zob_player: Array,
    fixed: Array,
    st_boxes: Array,
    st_player: Array,
    st_depth: Array,
    st_parent: Array,
    table: Array,
    vis: Array,
    vis2: Array,
    occ: Array,
    stack: Array,
    out: Array,
) -> int:
    """One attempt of :class:`~ragen_envs.sokoban.generator.SokobanGenerator`: carve a room, place the targets,
    search reverse play breadth-first, pick the level and put the player on it.

    ``u`` holds the attempt's uniform random numbers (see :func:`generate_uniform_count`), ``geo`` the walk masks and
    moves (:func:`room_geometry`). Writes the room into ``fixed`` (flat, ``rows * cols``) and ``out = [n_states,
    best_state, player_cell, depth]``; returns :data:`OK`, 1 when the room has too few floor cells or 2 when no state
    has every box off its target.
    """
    ncells = rows * cols
    # ---- 1. and 2. random-walk topology (gym-sokoban's process), then the targets on distinct floor cells -------
    k = _carve_room(rows, cols, num_boxes, 0, num_steps, p_change, u, geo, fixed, stack, st_boxes)
    if k < 0:
        return 1  # too few floor cells
    salt = int(u[k] * 1073741824.0)
    k += 1
    u_player = u[k]
    # ---- 3. breadth-first reverse play over (boxes, player region) ---------------------------------------------
    for i in range(tsize):
        table[i] = 0
    for i in range(ncells):
        vis[i] = 0
        vis2[i] = 0
        occ[i] = 0
    stamp2 = 0
    stamp = 0  # vis[i] == stamp marks cells of the region being filled
    ostamp = 0  # occ[i] == ostamp marks the box cells of the state being expanded
    tmask = tsize - 1
    # depth 0: the solved position with the player in each region of the free floor (every way a solution ends)
    ostamp += 1
    for j in range(num_boxes):
        occ[st_boxes[j]] = ostamp
    n = 0
    for start in range(ncells):
        if fixed[start] == 0 or occ[start] == ostamp or vis2[start] != 0:
            continue
        stamp2 += 1
        _fill_region(start, cols, geo, fixed, occ, ostamp, vis2, stamp2, stack)
        if n > 0:
            for j in range(num_boxes):
                st_boxes[n * num_boxes + j] = st_boxes[j]
        st_player[n] = start  # scanning in cell order, the first cell met is the region's smallest
        st_depth[n] = 0
        st_parent[n] = -1
        h = zob_player[start]
        for j in range(num_boxes):
            h ^= zob_box[st_boxes[j]]
        slot = h & tmask
        while table[slot] != 0:
            slot = (slot + 1) & tmask
        table[slot] = n + 1
        n += 1
        if n >= max_states:
            break
    best = -1
    best_depth = -1
    best_dist = -1
    best_tie = -1
    head = 0
    while head < n:
        cur = head
        head += 1
        base = cur * num_boxes
        # score the state: every box off target, then depth, then distance to the nearest targets, then a hash
        off = 0
        dist = 0
        for j in range(num_boxes):
            b = st_boxes[base + j]
            if fixed[b] != 2:
                off += 1
            br = b // cols
            bc = b - br * cols
            nearest = rows + cols
            for t in range(num_boxes):
                tc = st_boxes[t]  # state 0 holds the targets
                tr = tc // cols
                tcc = tc - tr * cols
                dm = abs(br - tr) + abs(bc - tcc)
                nearest = min(nearest, dm)
            dist += nearest
        if off == num_boxes:
            hh = zob_player[st_player[cur]]
            for j in range(num_boxes):
                hh ^= zob_box[st_boxes[base + j]]
            tie = (hh ^ salt) & 1073741823
            dep = st_depth[cur]
            if (
                (dep > best_depth)
                or (dep == best_depth and dist > best_dist)
                or (dep == best_depth and dist == best_dist and tie > best_tie)
            ):
                best = cur
                best_depth = dep
                best_dist = dist
                best_tie = tie
        if max_depth > 0 and st_depth[cur] >= max_depth:
            continue
        if n >= max_states:
            continue  # keep scoring the states already found, add no more
        # region of the player in this state
        ostamp += 1
        for j in range(num_boxes):
            occ[st_boxes[base + j]] = ostamp
        stamp += 1
        _fill_region(st_player[cur], cols, geo, fixed, occ, ostamp, vis, stamp, stack)
        region = stamp
        # every pull: player on p next to box b (p = b + step), steps on to q = p + step, the box follows to p
        for j in range(num_boxes):
            b = st_boxes[base + j]
            for dd in range(4):
                step = geo[_G_DIR_DR + dd] * cols + geo[_G_DIR_DC + dd]
                p = b + step
                q = p + step
                if vis[p] != region or fixed[q] == 0 or occ[q] == ostamp:
                    continue
                if n >= max_states:
                    break
                # child boxes: b replaced by p, kept sorted (written in place at slot n)
                nb = n * num_boxes
                w = 0
                for t in range(num_boxes):
                    x = st_boxes[base + t]
                    if t != j:
                        st_boxes[nb + w] = x
                        w += 1
                # insert p
                a = num_boxes - 1
                while a > 0 and st_boxes[nb + a - 1] > p:
                    st_boxes[nb + a] = st_boxes[nb + a - 1]
                    a -= 1
                st_boxes[nb + a] = p
                # child region: fill from q with the child's boxes (own stamp array); name it by its smallest cell
                occ[b] = 0
                occ[p] = ostamp
                stamp2 += 1
                low = _fill_region(q, cols, geo, fixed, occ, ostamp, vis2, stamp2, stack)
                occ[p] = 0
                occ[b] = ostamp
                h = zob_player[low]
                for t in range(num_boxes):
                    h ^= zob_box[st_boxes[nb + t]]
                slot, found = _find_state(table, tmask, h, st_player, st_boxes, num_boxes, low, st_boxes, nb)
                if not found:
                    table[slot] = n + 1
                    st_player[n] = low
                    st_depth[n] = st_depth[cur] + 1
                    st_parent[n] = cur * 4 * num_boxes + j * 4 + dd  # parent, pulled box index, direction
                    n += 1
    if best < 0:
        return 2  # no state with every box off its target
    # ---- 4. the player goes on a random cell of the chosen state's region --------------------------------------
    base = best * num_boxes
    ostamp += 1
    for j in range(num_boxes):
        occ[st_boxes[base + j]] = ostamp
    stamp += 1
    _fill_region(st_player[best], cols, geo, fixed, occ, ostamp, vis, stamp, stack)
    # pick from the region in row-major order: machine-independent
    cnt = 0
    for i in range(ncells):
        if vis[i] == stamp:
            cnt += 1
    pick = int(u_player * cnt)
    player = -1
    for i in range(ncells):
        if vis[i] == stamp:
            if pick == 0:
                player = i
                break
            pick -= 1
    out[0] = n
    out[1] = best
    out[2] = player
    out[3] = best_depth
    return 0


# ------------------------------------------------------------------------------------ the reference generator's kernel
def reference_kernel(
    rows: int,
    cols: int,
    num_boxes: int,
    num_steps: int,
    p_change: float,
    search_depth: int,
    max_explored: int,
    tries: int,
    seed_lo: int,
    seed_hi: int,
    geo: Array,
    zob: Array,
    fixed: Array,
    cells: Array,
    targets: Array,
    fr_player: Array,
    fr_loc: Array,
    fr_flag: Array,
    fr_swaps: Array,
    fr_last: Array,
    fr_ttl: Array,
    fr_act: Array,
    ex_player: Array,
    ex_key: Array,
    ex_slot: Array,
    table: Array,
    key_buf: Array,
    best_loc: Array,
    small: Array,
    u: Array,
    out: Array,
) -> int:
    """The search of :class:`~ragen_envs.sokoban.reference_generator.ReferenceGenerator`: draw rooms until one makes
    a level (at most ``tries``): carve it, place player and targets, run the reference's reverse-play DFS, walk the
    player.

    ``seed_lo`` / ``seed_hi`` (the seed's 32-bit halves) seed the random stream, xoshiro128**; each room first fills
    ``u`` with its uniforms (see :func:`reference_uniform_count`). ``geo`` holds the walk masks and moves
    (:func:`room_geometry`), ``zob`` the hash keys of player cells (``[0, ncells)``) and of (box cell, ever pulled)
    pairs (``ncells + key``). Writes the room into ``fixed`` (flat, ``rows * cols``; 0 wall, 1 floor, 2 target), the
    kept box cells into ``best_loc`` and ``out`` (see ``OUT_*``); returns :data:`OK` or the last room's failure code:
    1 too few floor cells, 2 no search root (``search_depth < 2``), 3 every state scored 0.
    """
    nb = num_boxes
    ncells = rows * cols
    nu = len(u)
    tmask = len(table) - 1
    # ---- the random stream: four 32-bit xoshiro128** words hashed from the seed (lowbias32, Wellons); values
    # stay below 2**32 and products below 2**49, so int64 arithmetic matches Python's exactly
    s0 = 0
    s1 = 0
    s2 = 0
    s3 = 0
    for w in range(4):
        x = (seed_lo ^ (0x9E3779B9 * (w + 1))) & 0xFFFFFFFF
        for rep in range(2):
            x ^= x >> 16
            x = (x * 0x352D + (((x * 0x7FEB) & 0xFFFF) << 16)) & 0xFFFFFFFF  # x * 0x7FEB352D mod 2**32
            x ^= x >> 15
            x = (x * 0xA68B + (((x * 0x846C) & 0xFFFF) << 16)) & 0xFFFFFFFF  # x * 0x846CA68B mod 2**32
            x ^= x >> 16
            if rep == 0:
                x ^= seed_hi
        if w == 0:
            s0 = x
        elif w == 1:
            s1 = x
        elif w == 2:
            s2 = x
        else:
            s3 = x
    if s0 == 0 and s1 == 0 and s2 == 0 and s3 == 0:
        s0 = 1  # the all-zero state is xoshiro's one fixed point
    status = 0
    for attempt in range(tries):
        out[OUT_ROOMS] = attempt + 1
        # ---- 0. this room's uniforms: xoshiro128** (32-bit words kept in int64, products stay below 2**40) ----------
        for i in range(nu):
            x = (s1 * 5) & 0xFFFFFFFF
            x = ((x << 7) | (x >> 25)) & 0xFFFFFFFF
            u[i] = ((x * 9) & 0xFFFFFFFF) * 2.3283064365386963e-10  # / 2**32: exact, so identical on both backends
            t = (s1 << 9) & 0xFFFFFFFF
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = ((s3 << 11) | (s3 >> 21)) & 0xFFFFFFFF
        # ---- 1. and 2. random-walk topology, then the player and the targets on distinct random floor cells ------
        k = _carve_room(rows, cols, nb, 1, num_steps, p_change, u, geo, fixed, cells, targets)
        if k < 0:
            status = 1  # too few floor cells (place_boxes_and_player's RuntimeError)
            continue
        player = cells[0]
        out[OUT_START] = player
        # ---- 3. reverse play: the reference's recursive DFS, as a loop over an explicit stack --------------------
        # Frame f holds one call's state: player cell, per box (identity j = its target) the cell and whether it was
        # ever pulled, box_swaps, last_pull (-1: none), ttl after the call's own decrement, and the next action to
        # try. The candidate frame (a call being entered) is written at top + 1 and pushed when its state is new.
        n = 0
        best_score = -1
        best_player = -1
        best_disp = 0
        best_swaps = 0
        fr_player[0] = player
        for j in range(nb):
            fr_loc[j] = targets[j]
            fr_flag[j] = 0
        fr_swaps[0] = 0
        fr_last[0] = -1
        fr_ttl[0] = search_depth - 1
        top = -1
        cand = 0
        while True:
            if cand >= 0:
                # entry of depth_first_search: ttl -= 1 (done by the caller); return if ttl <= 0 or at the cap
                if n >= max_explored:
                    break  # every later call returns at once: nothing can change any more
                if fr_ttl[cand] > 0:
                    cb = cand * nb
                    q = fr_player[cand]
                    # the state's key: player cell and the sorted (cell, ever pulled) pairs of the boxes
                    for j in range(nb):
                        x = fr_loc[cb + j] * 2 + fr_flag[cb + j]
                        b = j - 1
                        while b >= 0 and key_buf[b] > x:
                            key_buf[b + 1] = key_buf[b]
                            b -= 1
                        key_buf[b + 1] = x
                    h = zob[q]
                    for j in range(nb):
                        h ^= zob[ncells + key_buf[j]]
                    slot, found = _find_state(table, tmask, h, ex_player, ex_key, nb, q, key_buf, 0)
                    if not found:
                        # score: box_swaps * displacement, 0 unless every target is uncovered (no box, no player)
                        covered = 0
                        if fixed[q] == 2:
                            covered += 1
                        disp = 0
                        for j in range(nb):
                            x = fr_loc[cb + j]
                            if fixed[x] == 2:
                                covered += 1
                            t = targets[j]
                            xr = x // cols
                            tr = t // cols
                            disp += abs(xr - tr) + abs((x - xr * cols) - (t - tr * cols))
                        score = 0
                        if covered == 0:
                            score = fr_swaps[cand] * disp
                        if score > best_score:
                            best_score = score
                            best_player = q
                            best_disp = disp
                            best_swaps = fr_swaps[cand]
                            for j in range(nb):
                                best_loc[j] = fr_loc[cb + j]
                        table[slot] = n + 1
                        ex_slot[n] = slot
                        ex_player[n] = q
                        for j in range(nb):
                            ex_key[n * nb + j] = key_buf[j]
                        n += 1
                        fr_act[cand] = 0
                        top = cand
                cand = -1
            if top < 0:
                break
            # children of a frame with ttl <= 1 enter with ttl <= 0 and return at once
            if fr_act[top] >= 4 or fr_ttl[top] <= 1:
                top -= 1
                continue
            a = fr_act[top]
            fr_act[top] = a + 1
            # reverse_move with pull action a: the player steps to a free cell (floor or target: no wall, no box)
            p = fr_player[top]
            st = geo[_G_ACT + a]
            q = p + st
            if fixed[q] == 0:
                continue  # no move: the same state, already explored
            base = top * nb
            blocked = False
            for j in range(nb):
                if fr_loc[base + j] == q:
                    blocked = True
                    break
            if blocked:
                continue
            c1 = top + 1
            cb = c1 * nb
            behind = p - st
            pulled = -1
            for j in range(nb):
                x = fr_loc[base + j]
                fr_loc[cb + j] = x
                fr_flag[cb + j] = fr_flag[base + j]
                if x == behind:
                    pulled = j
            sw = fr_swaps[top]
            last = fr_last[top]
            if pulled >= 0:
                # the box behind the player follows it onto the cell it left
                fr_loc[cb + pulled] = p
                fr_flag[cb + pulled] = 1
                if pulled != last:
                    sw += 1
                last = pulled
            fr_player[c1] = q
            fr_swaps[c1] = sw
            fr_last[c1] = last
            fr_ttl[c1] = fr_ttl[top] - 1
            cand = c1
        # leave the hash table empty for the next room (clearing only the used slots)
        for i in range(n):
            table[ex_slot[i]] = 0
        out[OUT_STATES] = n
        out[OUT_SCORE] = best_score
        out[OUT_DISP] = best_disp
        out[OUT_SWAPS] = best_swaps
        out[OUT_PULLED] = best_player
        if best_score < 0:
            status = 2  # no root: search_depth < 2 (the reference crashes)
            continue
        if best_score == 0:
            status = 3  # every score 0 (generate_room's RuntimeWarning after its tries)
            continue
        # ---- 4. add_random_player_movement -----------------------------------------------------------------------
        p = best_player
        walked = 0
        move_probability = 0.5
        if best_disp == 1:
            move_probability = 0.8
        if not (u[k] > move_probability):
            small[0] = p  # cells stood on: small[0..walked]; free neighbours: small[4..]
            while walked < 3:
                nvalid = 0
                for a in range(4):
                    q = p + geo[_G_ACT + a]
                    ok = fixed[q] != 0
                    if ok:
                        for j in range(nb):
                            if best_loc[j] == q:
                                ok = False
                                break
                    if ok:
                        for j in range(walked + 1):
                            if small[j] == q:
                                ok = False
                                break
                    if ok:
                        small[4 + nvalid] = q
                        nvalid += 1
                if nvalid == 0:
                    break
                p = small[4 + int(u[k + 1 + 2 * walked] * nvalid)]
                walked += 1
                small[walked] = p
                if walked >= 3 or u[k + 2 * walked] > 0.5:
                    break
        out[OUT_PLAYER] = p
        out[OUT_WALK] = walked
        return 0
    return status
