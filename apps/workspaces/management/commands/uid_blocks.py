"""``manage.py uid_blocks``: this installation's block of workspace uids, and the machine's registry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.workspaces.unix import installation_block
from workers.backends import uidblocks
from workers.backends.base import BackendError


class Command(BaseCommand):
    help = (
        "Claim this installation's block of workspace uids (the embedded portal does at start; a portal run "
        "otherwise does on its first workload), list the machine's claims (--list), or release a block by "
        "hand (--release FIRST_UID): its accounts are deleted, once no process runs as them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--list", action="store_true", help="list every claim in the registry")
        parser.add_argument("--release", type=int, metavar="FIRST_UID", help="release the block starting at this uid")
        parser.add_argument(
            "--force", action="store_true", help="with --release: even where its installation's data directory remains"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if os.geteuid() != 0:
            self.stdout.write("Not root: workloads run in user namespaces of their own, with no workspace accounts.")
            return
        registry = Path(settings.PORTAL_UID_REGISTRY_DIR)
        try:
            if options["release"] is not None:
                self._release(registry, options["release"], force=options["force"])
            elif options["list"]:
                self._list(registry)
            else:
                block = installation_block()
                self.stdout.write(
                    f"Workspace accounts: uids {block.first_uid}-{block.last_uid} (registry {registry}, "
                    f"installation {block.installation_id})"
                )
        except BackendError as exc:
            raise CommandError(exc.message) from exc

    def _list(self, registry: Path) -> None:
        with uidblocks.locked(registry) as path:
            held = uidblocks.claims(path)
        for block in held:
            state = "live" if uidblocks.is_live(block) else "stale"
            accounts = len(uidblocks.block_accounts(block))
            self.stdout.write(
                f"{block.first_uid}-{block.last_uid}  {state:5}  {accounts} account(s)  {block.data_dir}  "
                f"(installation {block.installation_id}, claimed {block.claimed_at or '?'})"
            )
        if not held:
            self.stdout.write(f"No claims in {registry}.")

    def _release(self, registry: Path, first_uid: int, *, force: bool) -> None:
        with uidblocks.locked(registry) as path:
            block = next((b for b in uidblocks.claims(path) if b.first_uid == first_uid), None)
            if block is None:
                raise CommandError(f"no claim starts at uid {first_uid}; see manage.py uid_blocks --list")
            if uidblocks.is_live(block) and not force:
                raise CommandError(
                    f"uids {block.first_uid}-{block.last_uid} belong to the installation in {block.data_dir}, which "
                    "still exists: stop that portal and delete its data directory, or pass --force"
                )
            deleted = uidblocks.release(path, block)
        self.stdout.write(
            f"Released uids {block.first_uid}-{block.last_uid}; deleted accounts: {', '.join(deleted) or 'none'}"
        )
