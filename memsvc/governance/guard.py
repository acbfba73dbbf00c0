"""The PII guard of the write paths: the tenant's policy applied to text about to be stored.

Remember, Correct and the extraction pipeline call it before embedding and dedup, so the
vector and the content hash are of the stored text. It counts what it finds
(memsvc_pii_screened_total) and logs only kinds and counts, never the text.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from memsvc.errors import InvalidArgument
from memsvc.governance import pii
from memsvc.governance.policy import PII_KINDS, TenantPolicies, parse_pii_policy
from memsvc.observability.metrics import PII_SCREENED
from memsvc.storage.model import NewMemory

log = logging.getLogger(__name__)

# The first role of the vocabulary is the core one (as in Prefetch and the core-memory limit).
CORE_ROLE = "core"


class PiiGuard:
    """Resolves a tenant's PII policy and screens text with it."""

    def __init__(
        self,
        policies: TenantPolicies,
        *,
        phone_regions: Sequence[str] = pii.DEFAULT_PHONE_REGIONS,
        core_role: str = CORE_ROLE,
    ) -> None:
        self._policies = policies
        self._phone_regions = tuple(phone_regions)
        self._core_role = core_role

    def is_core(self, role: str, pinned: bool) -> bool:
        """Core memory (pinned, or the core role) never holds screened data, whatever the
        policy."""
        return pinned or role == self._core_role

    @classmethod
    def default(cls) -> PiiGuard:
        """Redact every kind, for every tenant (tests and tools without a runtime)."""
        return cls(
            TenantPolicies(None, default_pii=parse_pii_policy("redact"), default_message_ttl_s=0)
        )

    async def policy(self, tenant_id: str) -> Mapping[str, str]:
        return (await self._policies.get(tenant_id)).pii

    def screen(
        self, text: str, policy: Mapping[str, str], *, core: bool = False, may_reject: bool = True
    ) -> pii.Screened:
        """Screen one text (nothing is counted until ``record``)."""
        return pii.screen(
            text, policy, core=core, may_reject=may_reject, phone_regions=self._phone_regions
        )

    def record(self, path: str, screened: Sequence[pii.Screened]) -> None:
        """Count what one write found, by kind and action; log the kinds, never the text."""
        counts: dict[tuple[str, str], int] = {}
        for item in screened:
            for kind_action in item.found:
                counts[kind_action] = counts.get(kind_action, 0) + 1
        if not counts:
            return
        for (kind, action), n in counts.items():
            PII_SCREENED.labels(kind=kind, action=action, path=path).inc(n)
        log.debug(
            "pii screened on %s: %s",
            path,
            ", ".join(f"{kind} {action} x{n}" for (kind, action), n in sorted(counts.items())),
        )

    @staticmethod
    def refuse(field: str, screened: pii.Screened) -> None:
        """Raise INVALID_ARGUMENT naming the rejected kinds of one field, if any."""
        if not screened.rejected_kinds:
            return
        nouns = [pii.NOUNS[k] for k in screened.rejected_kinds]
        listed = nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + " and " + nouns[-1]
        raise InvalidArgument(
            f"{field} contains {listed}, which this tenant does not store; nothing was written"
        )

    async def screen_memory(
        self, tenant_id: str, memory: NewMemory
    ) -> tuple[NewMemory, tuple[str, ...]]:
        """Remember: the memory as it may be stored (content, subject and object screened)
        and the labels of what was redacted. INVALID_ARGUMENT, before anything is written,
        when it holds a kind the tenant rejects."""
        policy = await self.policy(tenant_id)
        core = self.is_core(memory.role, memory.pinned)
        fields = {
            name: self.screen(getattr(memory, name), policy, core=core)
            for name in ("content", "subject", "object")
        }
        self.record("remember", list(fields.values()))
        for name, screened in fields.items():
            self.refuse(name, screened)
        if not any(s.found for s in fields.values()):
            return memory, ()
        kinds = {k for s in fields.values() for k in s.redactions}
        labels = tuple(pii.LABELS[k] for k in PII_KINDS if k in kinds)
        stored = replace(
            memory,
            content=fields["content"].text,
            subject=fields["subject"].text,
            object=fields["object"].text,
        )
        return stored, labels

    async def screen_correction(
        self,
        tenant_id: str,
        new_content: str,
        reason: str,
        corrects_core: Callable[[], Awaitable[bool]],
    ) -> tuple[str, str]:
        """Correct: the new content and reason as they may be stored. ``corrects_core`` is
        asked only when personal data would be kept ("store"): a core memory redacts it."""
        policy = await self.policy(tenant_id)
        content = self.screen(new_content, policy)
        why = self.screen(reason, policy)
        if (content.kept or why.kept) and await corrects_core():
            content = self.screen(new_content, policy, core=True)
            why = self.screen(reason, policy, core=True)
        self.record("correct", [content, why])
        self.refuse("new_content", content)
        self.refuse("reason", why)
        return content.text, why.text
