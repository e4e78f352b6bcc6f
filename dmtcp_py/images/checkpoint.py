"""Writing one tree's checkpoint, from CRIU's dump to a published image.

The steps, in the order a round takes them (all blocking: the agent runs
them in a worker thread):

1. save_files: the program's threads stopped (parked), what CRIU does
   not keep: the files it maps shared, its scratch files, the length of
   the files it writes.  Before CRIU reads the tree, not after: a dump
   that ends the tree (a stopping checkpoint, -kc) leaves no /proc to
   read, and while CRIU dumps, its parasite's memory and socket are in
   the processes.  While CRIU starts and seizes the tree, though: it
   waits for them at its query-ext-files notification (dump's
   on_seized), before its parasite goes in.
2. dump: CRIU writes the tree into the same partial directory (never a
   name a restart would take); meanwhile its page files are hashed and
   sent toward the disk as far as they are written (images.follow).
3. take_sockets: the connection table and the drained bytes, as the
   drain left them (the refill changes them), the tree still stopped.
4. finish (after the coordinator's commit, while the program runs again):
   describe (the links of removed mapped files, from CRIU's files image:
   the manifest made in memory; not while the program waits for it),
   compress if asked, else keep the memory pages as chunks shared with the
   previous generation (images.chunks), the checksums a restart checks, the manifest written
   once, everything made durable, then the partial directory takes the
   image's name atomically (store.publish).
   Or discard: the partial directory goes, the previous image stays.
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from dmtcp_py.agent import criu_driver
from dmtcp_py.errors import ImageError
from dmtcp_py.frozen import field, mutable_record, record
from dmtcp_py.images import (chunks, compress, integrity, shared_files, store, temp_files,
                             tree_view, written_files)
from dmtcp_py.images import follow as follow_pages
from dmtcp_py.images.manifest import Manifest, load
from dmtcp_py.images.previous import Previous
from dmtcp_py.images.previous import stamp as previous_stamp


@mutable_record
class TreeFacts:
    """What the manifest says of the tree besides its files."""
    comp_id: str
    tree_id: str
    program: str
    argv: list[str]
    host: str
    agent_socket: str
    num_trees: int
    root_pid: int
    pids: list[int]
    shim_pids: list[int]
    stdio: dict[str, dict]     # see agent.stdio.describe
    external: list[str]        # CRIU --external ids of that stdio
    # pid -> its id in the tree's own PID namespace; empty: the tree has none
    ns_pids: dict[str, int] = field(default_factory=dict)
    init_dir: str = ""         # the init's working directory then (agent.init_dir)
    agent_socket_ns: bool = True  # its shims add the PID namespace (Manifest)
    options: dict[str, bool] = field(default_factory=dict)  # (Manifest)


@record
class SavedFiles:
    """What save_files read of the tree and kept, for the manifest."""
    view: tree_view.TreeView
    shared: list[dict]     # see images.shared_files
    temp: dict             # see images.temp_files
    written: list[dict]    # see images.written_files


@mutable_record
class Checkpoint:
    """One generation of one tree, from the dump until it is published or
    discarded."""
    generation: int
    partial: Path
    final: Path
    manifest: Manifest | None = None
    steps: dict[str, float] = field(default_factory=dict)  # step -> when it ended
    stored: chunks.Stored | None = None  # what the pages took (finish)
    # CRIU's page files of an incremental generation, set aside once
    # chunked: removed after the checkpoint's reply (~0.1-0.2 s per GiB),
    # before the kernel writes them back
    set_aside: Path | None = None
    # the page files hashed while CRIU wrote them, for finish's seal
    follower: follow_pages.PageFollower | None = None
    saved: SavedFiles | None = None  # save_files's, for describe
    facts: TreeFacts | None = None   # save_files's too
    sockets: list[dict] | None = None  # take_sockets's
    dumped_at: float = 0.0           # wall clock when CRIU was done: the manifest's time
    # the pre-copy of this round (images.precopy.Layer), the dump's parent:
    # finish stores the pages with it as the previous generation
    layer: object | None = None
    # the published generation a tracked dump left its unwritten pages to
    # (tracking_parent's): finish stores the pages with it
    previous: Previous | None = None

    @classmethod
    def begin(cls, ckptdir: Path, program: str, tree_id: str, generation: int) -> Checkpoint:
        name = store.image_name(program, tree_id)
        partial = store.make_partial(ckptdir, name, generation)
        _clear_stale(ckptdir, name)
        return cls(generation, partial, ckptdir / name)

    def dump(self, root_pid: int, log_path: Path, *, leave_running: bool,
             external: list[str], follow: bool = False,
             session: criu_driver.DumpSession | None = None,
             track: bool = False, parent: Path | None = None,
             on_dumped: Callable[[], None] | None = None,
             before_seizing: Callable[[], None] | None = None,
             on_seized: Callable[[], None] | None = None) -> None:
        """follow: hash the page files while CRIU writes them and start
        their writeback (images.follow); for pages that finish() seals as
        CRIU left them (not compressed, not chunked).  session: CRIU
        started already (criu_driver.begin_dump), used and closed.  track,
        parent: write tracking (criu_driver.dump; parent: tracking_parent's),
        for a generation finish() stores as chunks.  on_dumped,
        before_seizing, on_seized: criu_driver.dump's."""
        follower = follow_pages.PageFollower(self.partial) if follow else None
        if follower is not None:
            follower.start()
        try:
            criu_driver.dump(root_pid, self.partial, log_path, leave_running=leave_running,
                             external=external, session=session, track=track, parent=parent,
                             on_dumped=on_dumped, before_seizing=before_seizing,
                             on_seized=on_seized)
        except BaseException:
            if follower is not None:
                follower.close()
            raise
        finally:
            if parent is not None:  # CRIU's link to it: the generation must stand alone
                try:
                    os.unlink(self.partial / PARENT_LINK)
                except FileNotFoundError:
                    pass
                store.discard(parent)  # (tracking_parent's)
        if follower is not None:
            follower.stop()
            self.follower = follower
        self.dumped_at = time.time()
        self.steps["criu"] = time.monotonic()

    def tracking_parent(self, generation: int, view: Path,
                        prepared: Previous | None = None) -> Path | None:
        """For a dump with write tracking whose pages were last protected
        by the dump of `generation`: parent_view of the published
        generation, if it is that one and its chunks can be shared; else
        None, and the dump writes every page.  prepared: that generation
        as read_previous read it before, taken if it is still the one
        published (finish() stores the pages with it)."""
        previous = prepared if prepared is not None and prepared.current() else \
            read_previous(self.final)
        if previous is None or previous.manifest.generation != generation:
            return None
        self.previous = previous
        return parent_view(self.final, view, previous.pages_ids())

    def written(self) -> int:
        """Bytes written so far (while CRIU dumps)."""
        return store.directory_bytes(self.partial)

    def save_files(self, facts: TreeFacts,
                   links: dict[int, list[tuple[int, str]]] | None = None) -> None:
        """The files CRIU leaves out, saved into the partial directory
        while CRIU starts and seizes the tree, before it reads any of its
        processes (tree_work waits for them there).  The program's threads
        are stopped until after the dump: the mapped files are as the
        dumped memory sees them.  links:
        the fds of processes read since they stopped (TreeView.read)."""
        partial = self.partial
        # /proc once: each process's maps and fds, for all that follows
        view = tree_view.TreeView.read(facts.pids, links)
        shared = shared_files.save(tree_view.mapped_files(view), partial)
        handed_over = {d["path"] for d in facts.stdio.values()}
        kept = handed_over | {s["path"] for s in shared}
        self.saved = SavedFiles(view, shared, temp_files.save(view, partial, kept),
                                written_files.collect(view, kept))
        self.facts = facts
        self.steps["files"] = time.monotonic()

    def take_sockets(self, sockets: Callable[[Path], list[dict]]) -> int:
        """The connection table, once CRIU dumped the tree, while its
        threads are still stopped (sockets writes the drained bytes beside
        the images); the rest of the manifest waits for finish.  Returns
        the bytes of the images."""
        self.sockets = sockets(self.partial)
        self.steps["sockets"] = time.monotonic()
        return self.written()

    def describe(self) -> Manifest:
        """The manifest (in memory), from CRIU's images and what was
        taken while the tree was stopped; the program may run meanwhile."""
        assert self.saved is not None and self.facts is not None, "describe before save_files"
        assert self.sockets is not None, "describe before take_sockets"
        partial, saved, facts = self.partial, self.saved, self.facts
        files_img = criu_driver.FilesImage(partial)  # read once, for both
        files_img.fix()
        remaps = []
        link_remaps = files_img.link_remaps()
        if link_remaps:
            # (names save_files looked up while the tree was stopped: the
            # view keeps them, the directories are not read again)
            aliases = tree_view.deleted_aliases(saved.view)
            remaps = [{"remap": remap, "live": aliases[orig]}
                      for remap, orig in link_remaps if orig in aliases]
        self.manifest = Manifest(
            comp_id=facts.comp_id, tree_id=facts.tree_id, program=facts.program,
            argv=facts.argv, host=facts.host, generation=self.generation, time=self.dumped_at,
            root_pid=facts.root_pid, pids=sorted(facts.pids), peers=len(facts.shim_pids),
            shim_pids=sorted(facts.shim_pids), shared_files=saved.shared,
            written_files=saved.written, sockets=self.sockets, link_remaps=remaps,
            temp_files=saved.temp,
            agent_socket=facts.agent_socket, num_trees=facts.num_trees, stdio=facts.stdio,
            external=facts.external, criu_version=criu_driver.version(),
            pid_namespace=bool(facts.ns_pids), ns_pids=facts.ns_pids, init_dir=facts.init_dir,
            agent_socket_ns=facts.agent_socket_ns, options=dict(facts.options),
            files=store.file_sizes(partial))
        self.steps["manifest"] = time.monotonic()
        return self.manifest

    def finish(self, *, compressed: bool, keep: int | None = None,
               durable: bool = True, incremental: bool = False,
               share: bool = True) -> list[Path]:
        """Describe the tree, compress (if asked) or
        (incremental) store the pages as chunks
        (share=False: none shared with the previous generation), checksum,
        write the manifest once, make it all durable (unless not durable:
        an image that only carries a migration) and give it the image's
        name, keeping `keep` previous generations.  Returns the expired
        generations, already out of the way, for the caller to delete."""
        m = self.describe()
        followed: dict = {}
        if self.follower is not None:
            follower, self.follower = self.follower, None
            if compressed or incremental or self.layer is not None:  # changed before the seal
                follower.close()
            else:
                followed = follower.taken()
        stored = chunks.Stored()
        prepared: Previous | None = None
        replaced = None  # the generation this one takes the name of, if known
        if compressed and compress.compress(self.partial):
            m = replace(m, compression=compress.NAME)
        elif incremental or self.layer is not None:
            if self.layer is not None:  # (a pre-copy: it shared what it could)
                before, previous = self.layer.directory, self.layer.stored
            elif share and self.previous is not None:  # (what the tracked dump left pages to)
                prepared = self.previous
                before, previous, replaced = self.final, prepared.manifest, \
                    prepared.manifest.generation
            else:
                published = shareable_previous(self.final) if share else None
                before, previous = (self.final, published) if published else (None, None)
                replaced = published.generation if published else None
            self.set_aside = self.partial.with_name(self.partial.name + ".dumped")
            stored = chunks.store(
                self.partial, self.generation, before, previous, self.set_aside,
                index=prepared.index if prepared is not None else None,
                parents=prepared.parent if prepared is not None else None)
            self.stored = stored
            self.steps["chunks"] = time.monotonic()
        # with CRIU's files set aside, no syncfs: it would write them to the
        # disk.  A write-tracked dump's pages file becomes the data file as
        # it lies (chunks._in_place) and leaves the directory empty: then
        # one syncfs (1.2-1.6 ms here) instead of an fsync of each small
        # file (3.2-5.3 ms, for a 1 GiB program's second generation)
        aside = self.set_aside is not None and self.set_aside.exists()
        held_aside = aside and store.directory_bytes(self.set_aside) > 0
        # data files' digests are lists of chunk digests: one algorithm for the manifest
        algorithm = chunks.ALGORITHM if stored.data else integrity.ALGORITHM
        sealed = integrity.seal(self.partial, frozenset(stored.data), each=held_aside,
                                durable=durable, followed=followed, algorithm=algorithm)
        self.steps["seal"] = time.monotonic()
        digests = dict(sorted({**sealed.digests, **stored.digests}.items()))
        m = replace(m, files=dict(sorted({**sealed.sizes, **stored.sizes}.items())),
                    data=stored.data, data_xxh3=dict(sorted(stored.quick.items())),
                    pages=stored.pages, **{algorithm: digests})
        self.manifest = m
        m.write(self.partial)
        expired = store.publish(self.partial, self.final, keep, durable, replaced)
        self.steps["publish"] = time.monotonic()
        self._drop_layer()  # (names only: what the generation uses, it linked)
        return expired + ([self.set_aside] if aside else [])

    def discard(self) -> None:
        if self.follower is not None:
            self.follower.close()
            self.follower = None
        store.discard(self.partial)
        if self.set_aside is not None:
            store.discard(self.set_aside)
        self._drop_layer()

    def _drop_layer(self) -> None:
        layer, self.layer = self.layer, None
        if layer is not None:
            store.discard(layer.directory)


PARENT_LINK = "parent"  # what CRIU names the link to a dump's parent images
# of a pre-copy's directory (images.precopy): .<image>.partial-<generation>-<pid>.precopy
PRECOPY_SUFFIX = ".precopy"


def parent_view(images: Path, view: Path, pages_ids: dict[str, int] | None = None) -> Path | None:
    """A directory (view, made anew) that shows CRIU the pagemaps of
    images, a generation or a pre-copy whose pagemaps are whole (and its
    inventory, and an empty pages file each: CRIU opens them but reads
    none), for a tracked dump to leave the pages not written since in; None
    if a pagemap cannot be read (the dump then writes every page).
    pages_ids: each pagemap's pages id, if known (Previous.pages_ids)."""
    from dmtcp_py.images import page_chain
    if pages_ids is None:
        pages_ids = {}
        for pagemap in images.glob("pagemap-*.img"):
            pm = page_chain.read_pagemap(pagemap)
            if pm is None:
                return None
            pages_ids[pagemap.name] = pm.pages_id
    store.discard(view)
    view.mkdir(mode=0o700)
    for name, pages_id in pages_ids.items():
        os.symlink(images / name, view / name)
        (view / f"pages-{pages_id}.img").touch(mode=0o600)
    os.symlink(images / "inventory.img", view / "inventory.img")
    return view


def read_previous(final: Path) -> Previous | None:
    """The generation published under the image's name, for the next
    tracked dump (images.previous), if its chunks can be shared."""
    read_at = previous_stamp(final)
    m = shareable_previous(final)
    return Previous(final, m, read_at) if m is not None else None


def shareable_previous(final: Path) -> Manifest | None:
    """The manifest of the generation published under the image's name, if
    it is whole and its chunks can be shared; None: write a full one."""
    try:
        m = load(final)
    except ImageError:
        return None
    return m if m.data and not m.compression and getattr(m, chunks.ALGORITHM) else None


def _clear_stale(ckptdir: Path, name: str) -> None:
    """Remove what an agent or a restart that is gone left of this image's
    checkpoints (.<image>.partial-<generation>-<pid>[.dumped]) and restarts
    (.<image>.restore-<pid>: its hard links would keep pruned generations'
    data files on the disk).  A generation it had moved aside
    (.<image>.gen-<N>.expired-<pid>) gets its name back: whether its round
    ended well is not known (this publication prunes it if it should go)."""
    for stale in [*ckptdir.glob(f".{name}.partial-*-*"), *ckptdir.glob(f".{name}.restore-*"),
                  *ckptdir.glob(f".{name}.gen-*.expired-*")]:
        try:
            pid = int(stale.name.removesuffix(".dumped").removesuffix(PRECOPY_SUFFIX)
                      .rsplit("-", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            if store.retired_name(stale.name) is not None:
                store.unretire(stale)
            else:
                store.discard(stale)
        except (ValueError, IndexError, PermissionError):
            pass


def delete(paths: list[Path]) -> None:
    for path in paths:
        store.discard(path)


def bring_back(paths: list[Path]) -> None:
    """Expired generations (store.publish's) given their names back."""
    for path in paths:
        store.unretire(path)


def step_times(start: float, marks: dict[str, float]) -> str:
    """'a 3.1, b 40.2': the time each marked step took after the previous."""
    out, prev = [], start
    for name, at in marks.items():
        out.append(f"{name} {(at - prev) * 1e3:.1f}")
        prev = at
    return ", ".join(out)
