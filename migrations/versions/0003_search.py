"""Full-text search over event contents: a GIN index on Postgres, FTS5 on SQLite, a words
table on MySQL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 00:00:00

An event's text is the string values of its content at any depth, joined by spaces, of
which the first 200,000 characters are searched; a word is a run of Unicode letters,
digits and marks (L*, N*, M*, Co as of Unicode 14), matched whole and without case. The
tables below are frozen copies of ``durable_sessions.fulltext`` (a test checks that they
agree).

Postgres: IMMUTABLE functions turn a content into its words and a tsvector of them (at
their positions, to count occurrences), and a search text into a tsquery; the column
``ds_events.search_vector`` holds each event's, under the GIN index ``ix_ds_events_search``.
Neither the column nor the functions are in the SQLAlchemy metadata: the library's
statements name their columns. Online (``online.py``): the column is added empty (no
rewrite), the trigger ``ds_events_search_vector`` fills it for every insert that brings no
vector (as revision 0008 has it), the events already stored get theirs in batches of short
transactions (resumable: the rows still without a vector), then the index is built
``CONCURRENTLY``. Until the backfill ends, a search misses the events not yet filled.

SQLite: an FTS5 table over the same text, kept in step with ``ds_events`` by triggers on
insert, delete and update (appends, truncations, forks, deletes, purges and imports all
go through them; foreign-key cascades fire them too). FTS5 rows are keyed by the integer
key of ``ds_events_fts_rowid``, never by ``ds_events``' own rowid, which VACUUM may
renumber; the FTS5 table reads its text back through the view ``ds_events_fts_text``.
The events already stored are indexed here, in batches of short write transactions (the
events without a key in ``ds_events_fts_rowid``).

MySQL (MariaDB): the table ``ds_event_words``, one row per distinct word of an event with
its number of occurrences, under a primary key that leads with (organisation, word); the
store writes an event's words with the event (the rules above, applied in Python), and a
foreign key on the event removes them with it. No MySQL database held events before
this revision could run there, so there is nothing to fill. A later revision that rebuilds
``ds_events`` (a batch "move and copy") drops these triggers with the old table and must
create them again.

Databases this revision reached in an earlier form hold ``search_vector`` as a generated
column instead; revision 0007 makes it the plain column filled by the trigger.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAX_TEXT = 200_000
MAX_WORD = 255

WORD_RANGES = """
0030-0039 0041-005A 0061-007A 00AA 00B2-00B3 00B5 00B9-00BA 00BC-00BE 00C0-00D6
00D8-00F6 00F8-02C1 02C6-02D1 02E0-02E4 02EC 02EE 0300-0374 0376-0377 037A-037D 037F
0386 0388-038A 038C 038E-03A1 03A3-03F5 03F7-0481 0483-052F 0531-0556 0559 0560-0588
0591-05BD 05BF 05C1-05C2 05C4-05C5 05C7 05D0-05EA 05EF-05F2 0610-061A 0620-0669
066E-06D3 06D5-06DC 06DF-06E8 06EA-06FC 06FF 0710-074A 074D-07B1 07C0-07F5 07FA 07FD
0800-082D 0840-085B 0860-086A 0870-0887 0889-088E 0898-08E1 08E3-0963 0966-096F
0971-0983 0985-098C 098F-0990 0993-09A8 09AA-09B0 09B2 09B6-09B9 09BC-09C4 09C7-09C8
09CB-09CE 09D7 09DC-09DD 09DF-09E3 09E6-09F1 09F4-09F9 09FC 09FE 0A01-0A03 0A05-0A0A
0A0F-0A10 0A13-0A28 0A2A-0A30 0A32-0A33 0A35-0A36 0A38-0A39 0A3C 0A3E-0A42 0A47-0A48
0A4B-0A4D 0A51 0A59-0A5C 0A5E 0A66-0A75 0A81-0A83 0A85-0A8D 0A8F-0A91 0A93-0AA8
0AAA-0AB0 0AB2-0AB3 0AB5-0AB9 0ABC-0AC5 0AC7-0AC9 0ACB-0ACD 0AD0 0AE0-0AE3 0AE6-0AEF
0AF9-0AFF 0B01-0B03 0B05-0B0C 0B0F-0B10 0B13-0B28 0B2A-0B30 0B32-0B33 0B35-0B39
0B3C-0B44 0B47-0B48 0B4B-0B4D 0B55-0B57 0B5C-0B5D 0B5F-0B63 0B66-0B6F 0B71-0B77
0B82-0B83 0B85-0B8A 0B8E-0B90 0B92-0B95 0B99-0B9A 0B9C 0B9E-0B9F 0BA3-0BA4 0BA8-0BAA
0BAE-0BB9 0BBE-0BC2 0BC6-0BC8 0BCA-0BCD 0BD0 0BD7 0BE6-0BF2 0C00-0C0C 0C0E-0C10
0C12-0C28 0C2A-0C39 0C3C-0C44 0C46-0C48 0C4A-0C4D 0C55-0C56 0C58-0C5A 0C5D 0C60-0C63
0C66-0C6F 0C78-0C7E 0C80-0C83 0C85-0C8C 0C8E-0C90 0C92-0CA8 0CAA-0CB3 0CB5-0CB9
0CBC-0CC4 0CC6-0CC8 0CCA-0CCD 0CD5-0CD6 0CDD-0CDE 0CE0-0CE3 0CE6-0CEF 0CF1-0CF2
0D00-0D0C 0D0E-0D10 0D12-0D44 0D46-0D48 0D4A-0D4E 0D54-0D63 0D66-0D78 0D7A-0D7F
0D81-0D83 0D85-0D96 0D9A-0DB1 0DB3-0DBB 0DBD 0DC0-0DC6 0DCA 0DCF-0DD4 0DD6 0DD8-0DDF
0DE6-0DEF 0DF2-0DF3 0E01-0E3A 0E40-0E4E 0E50-0E59 0E81-0E82 0E84 0E86-0E8A 0E8C-0EA3
0EA5 0EA7-0EBD 0EC0-0EC4 0EC6 0EC8-0ECD 0ED0-0ED9 0EDC-0EDF 0F00 0F18-0F19 0F20-0F33
0F35 0F37 0F39 0F3E-0F47 0F49-0F6C 0F71-0F84 0F86-0F97 0F99-0FBC 0FC6 1000-1049
1050-109D 10A0-10C5 10C7 10CD 10D0-10FA 10FC-1248 124A-124D 1250-1256 1258 125A-125D
1260-1288 128A-128D 1290-12B0 12B2-12B5 12B8-12BE 12C0 12C2-12C5 12C8-12D6 12D8-1310
1312-1315 1318-135A 135D-135F 1369-137C 1380-138F 13A0-13F5 13F8-13FD 1401-166C
166F-167F 1681-169A 16A0-16EA 16EE-16F8 1700-1715 171F-1734 1740-1753 1760-176C
176E-1770 1772-1773 1780-17D3 17D7 17DC-17DD 17E0-17E9 17F0-17F9 180B-180D 180F-1819
1820-1878 1880-18AA 18B0-18F5 1900-191E 1920-192B 1930-193B 1946-196D 1970-1974
1980-19AB 19B0-19C9 19D0-19DA 1A00-1A1B 1A20-1A5E 1A60-1A7C 1A7F-1A89 1A90-1A99 1AA7
1AB0-1ACE 1B00-1B4C 1B50-1B59 1B6B-1B73 1B80-1BF3 1C00-1C37 1C40-1C49 1C4D-1C7D
1C80-1C88 1C90-1CBA 1CBD-1CBF 1CD0-1CD2 1CD4-1CFA 1D00-1F15 1F18-1F1D 1F20-1F45
1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FBC 1FBE 1FC2-1FC4
1FC6-1FCC 1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4 1FF6-1FFC 2070-2071 2074-2079
207F-2089 2090-209C 20D0-20F0 2102 2107 210A-2113 2115 2119-211D 2124 2126 2128
212A-212D 212F-2139 213C-213F 2145-2149 214E 2150-2189 2460-249B 24EA-24FF 2776-2793
2C00-2CE4 2CEB-2CF3 2CFD 2D00-2D25 2D27 2D2D 2D30-2D67 2D6F 2D7F-2D96 2DA0-2DA6
2DA8-2DAE 2DB0-2DB6 2DB8-2DBE 2DC0-2DC6 2DC8-2DCE 2DD0-2DD6 2DD8-2DDE 2DE0-2DFF 2E2F
3005-3007 3021-302F 3031-3035 3038-303C 3041-3096 3099-309A 309D-309F 30A1-30FA
30FC-30FF 3105-312F 3131-318E 3192-3195 31A0-31BF 31F0-31FF 3220-3229 3248-324F
3251-325F 3280-3289 32B1-32BF 3400-4DBF 4E00-A48C A4D0-A4FD A500-A60C A610-A62B
A640-A672 A674-A67D A67F-A6F1 A717-A71F A722-A788 A78B-A7CA A7D0-A7D1 A7D3 A7D5-A7D9
A7F2-A827 A82C A830-A835 A840-A873 A880-A8C5 A8D0-A8D9 A8E0-A8F7 A8FB A8FD-A92D
A930-A953 A960-A97C A980-A9C0 A9CF-A9D9 A9E0-A9FE AA00-AA36 AA40-AA4D AA50-AA59
AA60-AA76 AA7A-AAC2 AADB-AADD AAE0-AAEF AAF2-AAF6 AB01-AB06 AB09-AB0E AB11-AB16
AB20-AB26 AB28-AB2E AB30-AB5A AB5C-AB69 AB70-ABEA ABEC-ABED ABF0-ABF9 AC00-D7A3
D7B0-D7C6 D7CB-D7FB E000-FA6D FA70-FAD9 FB00-FB06 FB13-FB17 FB1D-FB28 FB2A-FB36
FB38-FB3C FB3E FB40-FB41 FB43-FB44 FB46-FBB1 FBD3-FD3D FD50-FD8F FD92-FDC7 FDF0-FDFB
FE00-FE0F FE20-FE2F FE70-FE74 FE76-FEFC FF10-FF19 FF21-FF3A FF41-FF5A FF66-FFBE
FFC2-FFC7 FFCA-FFCF FFD2-FFD7 FFDA-FFDC 10000-1000B 1000D-10026 10028-1003A 1003C-1003D
1003F-1004D 10050-1005D 10080-100FA 10107-10133 10140-10178 1018A-1018B 101FD
10280-1029C 102A0-102D0 102E0-102FB 10300-10323 1032D-1034A 10350-1037A 10380-1039D
103A0-103C3 103C8-103CF 103D1-103D5 10400-1049D 104A0-104A9 104B0-104D3 104D8-104FB
10500-10527 10530-10563 10570-1057A 1057C-1058A 1058C-10592 10594-10595 10597-105A1
105A3-105B1 105B3-105B9 105BB-105BC 10600-10736 10740-10755 10760-10767 10780-10785
10787-107B0 107B2-107BA 10800-10805 10808 1080A-10835 10837-10838 1083C 1083F-10855
10858-10876 10879-1089E 108A7-108AF 108E0-108F2 108F4-108F5 108FB-1091B 10920-10939
10980-109B7 109BC-109CF 109D2-10A03 10A05-10A06 10A0C-10A13 10A15-10A17 10A19-10A35
10A38-10A3A 10A3F-10A48 10A60-10A7E 10A80-10A9F 10AC0-10AC7 10AC9-10AE6 10AEB-10AEF
10B00-10B35 10B40-10B55 10B58-10B72 10B78-10B91 10BA9-10BAF 10C00-10C48 10C80-10CB2
10CC0-10CF2 10CFA-10D27 10D30-10D39 10E60-10E7E 10E80-10EA9 10EAB-10EAC 10EB0-10EB1
10F00-10F27 10F30-10F54 10F70-10F85 10FB0-10FCB 10FE0-10FF6 11000-11046 11052-11075
1107F-110BA 110C2 110D0-110E8 110F0-110F9 11100-11134 11136-1113F 11144-11147
11150-11173 11176 11180-111C4 111C9-111CC 111CE-111DA 111DC 111E1-111F4 11200-11211
11213-11237 1123E 11280-11286 11288 1128A-1128D 1128F-1129D 1129F-112A8 112B0-112EA
112F0-112F9 11300-11303 11305-1130C 1130F-11310 11313-11328 1132A-11330 11332-11333
11335-11339 1133B-11344 11347-11348 1134B-1134D 11350 11357 1135D-11363 11366-1136C
11370-11374 11400-1144A 11450-11459 1145E-11461 11480-114C5 114C7 114D0-114D9
11580-115B5 115B8-115C0 115D8-115DD 11600-11640 11644 11650-11659 11680-116B8
116C0-116C9 11700-1171A 1171D-1172B 11730-1173B 11740-11746 11800-1183A 118A0-118F2
118FF-11906 11909 1190C-11913 11915-11916 11918-11935 11937-11938 1193B-11943
11950-11959 119A0-119A7 119AA-119D7 119DA-119E1 119E3-119E4 11A00-11A3E 11A47
11A50-11A99 11A9D 11AB0-11AF8 11C00-11C08 11C0A-11C36 11C38-11C40 11C50-11C6C
11C72-11C8F 11C92-11CA7 11CA9-11CB6 11D00-11D06 11D08-11D09 11D0B-11D36 11D3A
11D3C-11D3D 11D3F-11D47 11D50-11D59 11D60-11D65 11D67-11D68 11D6A-11D8E 11D90-11D91
11D93-11D98 11DA0-11DA9 11EE0-11EF6 11FB0 11FC0-11FD4 12000-12399 12400-1246E
12480-12543 12F90-12FF0 13000-1342E 14400-14646 16800-16A38 16A40-16A5E 16A60-16A69
16A70-16ABE 16AC0-16AC9 16AD0-16AED 16AF0-16AF4 16B00-16B36 16B40-16B43 16B50-16B59
16B5B-16B61 16B63-16B77 16B7D-16B8F 16E40-16E96 16F00-16F4A 16F4F-16F87 16F8F-16F9F
16FE0-16FE1 16FE3-16FE4 16FF0-16FF1 17000-187F7 18800-18CD5 18D00-18D08 1AFF0-1AFF3
1AFF5-1AFFB 1AFFD-1AFFE 1B000-1B122 1B150-1B152 1B164-1B167 1B170-1B2FB 1BC00-1BC6A
1BC70-1BC7C 1BC80-1BC88 1BC90-1BC99 1BC9D-1BC9E 1CF00-1CF2D 1CF30-1CF46 1D165-1D169
1D16D-1D172 1D17B-1D182 1D185-1D18B 1D1AA-1D1AD 1D242-1D244 1D2E0-1D2F3 1D360-1D378
1D400-1D454 1D456-1D49C 1D49E-1D49F 1D4A2 1D4A5-1D4A6 1D4A9-1D4AC 1D4AE-1D4B9 1D4BB
1D4BD-1D4C3 1D4C5-1D505 1D507-1D50A 1D50D-1D514 1D516-1D51C 1D51E-1D539 1D53B-1D53E
1D540-1D544 1D546 1D54A-1D550 1D552-1D6A5 1D6A8-1D6C0 1D6C2-1D6DA 1D6DC-1D6FA
1D6FC-1D714 1D716-1D734 1D736-1D74E 1D750-1D76E 1D770-1D788 1D78A-1D7A8 1D7AA-1D7C2
1D7C4-1D7CB 1D7CE-1D7FF 1DA00-1DA36 1DA3B-1DA6C 1DA75 1DA84 1DA9B-1DA9F 1DAA1-1DAAF
1DF00-1DF1E 1E000-1E006 1E008-1E018 1E01B-1E021 1E023-1E024 1E026-1E02A 1E100-1E12C
1E130-1E13D 1E140-1E149 1E14E 1E290-1E2AE 1E2C0-1E2F9 1E7E0-1E7E6 1E7E8-1E7EB
1E7ED-1E7EE 1E7F0-1E7FE 1E800-1E8C4 1E8C7-1E8D6 1E900-1E94B 1E950-1E959 1EC71-1ECAB
1ECAD-1ECAF 1ECB1-1ECB4 1ED01-1ED2D 1ED2F-1ED3D 1EE00-1EE03 1EE05-1EE1F 1EE21-1EE22
1EE24 1EE27 1EE29-1EE32 1EE34-1EE37 1EE39 1EE3B 1EE42 1EE47 1EE49 1EE4B 1EE4D-1EE4F
1EE51-1EE52 1EE54 1EE57 1EE59 1EE5B 1EE5D 1EE5F 1EE61-1EE62 1EE64 1EE67-1EE6A
1EE6C-1EE72 1EE74-1EE77 1EE79-1EE7C 1EE7E 1EE80-1EE89 1EE8B-1EE9B 1EEA1-1EEA3
1EEA5-1EEA9 1EEAB-1EEBB 1F100-1F10C 1FBF0-1FBF9 20000-2A6DF 2A700-2B738 2B740-2B81D
2B820-2CEA1 2CEB0-2EBE0 2F800-2FA1D 30000-3134A E0100-E01EF F0000-FFFFD 100000-10FFFD
"""

SQLITE_SEPARATORS = """
058D-058E 0605 061C-061D 07FE-07FF 0888 0890-0891 08E2 09FD 0A76 0C77 0C84 0D4F
1B7D-1B7E 2066-2069 20BA-20C0 218A-218B 23F4-23FF 2700 2B4D-2B4F 2B5A-2B73 2B76-2B95
2B97-2BFF 2E3C-2E5D 32FF A8FC AB5B AB6A-AB6B FBC2 FD40-FD4F FDCF FDFE-FDFF 1018C-1018E
1019C 101A0 1056F 10877-10878 10AC8 10AF0-10AF6 10B99-10B9C 10EAD 10F55-10F59
10F86-10F89 110CD 11174-11175 111CD 111DB 111DD-111DF 11238-1123D 112A9 1144B-1144F
1145A-1145B 1145D 114C6 115C1-115D7 11641-11643 11660-1166C 116B9 1173C-1173F 1183B
11944-11946 119E2 11A3F-11A46 11A9A-11A9C 11A9E-11AA2 11C41-11C45 11C70-11C71
11EF7-11EF8 11FD5-11FF1 11FFF 12474 12FF1-12FF2 13430-13438 16A6E-16A6F 16AF5
16B37-16B3F 16B44-16B45 16E97-16E9A 16FE2 1BC9C 1BC9F-1BCA3 1CF50-1CFC3 1D1DE-1D1EA
1D800-1D9FF 1DA37-1DA3A 1DA6D-1DA74 1DA76-1DA83 1DA85-1DA8B 1E14F 1E2FF 1E95E-1E95F
1ECAC 1ECB0 1ED2E 1F0BF 1F0E0-1F0F5 1F10D-1F10F 1F12F 1F16C-1F16F 1F19B-1F1AD 1F23B
1F260-1F265 1F321-1F32F 1F336 1F37D-1F37F 1F394-1F39F 1F3C5 1F3CB-1F3DF 1F3F1-1F3FF
1F43F 1F441 1F4F8 1F4FD-1F4FF 1F53E-1F53F 1F544-1F54F 1F568-1F5FA 1F641-1F644
1F650-1F67F 1F6C6-1F6D7 1F6DD-1F6EC 1F6F0-1F6FC 1F780-1F7D8 1F7E0-1F7EB 1F7F0
1F800-1F80B 1F810-1F847 1F850-1F859 1F860-1F887 1F890-1F8AD 1F8B0-1F8B1 1F900-1FA53
1FA60-1FA6D 1FA70-1FA74 1FA78-1FA7C 1FA80-1FA86 1FA90-1FAAC 1FAB0-1FABA 1FAC0-1FAC5
1FAD0-1FAD9 1FAE0-1FAE7 1FAF0-1FAF6 1FB00-1FB92 1FB94-1FBCA
"""

FOLD_FROM = "\u00b5\u017f\u0345\u03c2\u03d0\u03d1\u03d5\u03d6\u03f0\u03f1\u03f5\u1e9b\u1fbe"
FOLD_TO = "\u03bc\u0073\u03b9\u03c3\u03b2\u03b8\u03c6\u03c0\u03ba\u03c1\u03b5\u1e61\u03b9"

TRIGGER = "ds_events_search_vector"
"""The trigger, and its function, that fill the vector of an insert that brings none."""
PG_FUNCTIONS = ("ds_search_query", "ds_search_vector", "ds_search_words", "ds_search_text")
SQLITE_TRIGGERS = ("ds_events_fts_insert", "ds_events_fts_delete", "ds_events_fts_update")
Q = "'"  # a single quote, doubled inside SQL literals
# In jsonb's text of an array of strings: an escape, or the '", "' between two strings.
ESCAPES = r'\\(u[0-9a-fA-F]{4}|.)|", "'


def _online() -> ModuleType:
    """The online steps of the revisions (``migrations/online.py``), loaded by path."""
    path = Path(__file__).resolve().parents[1] / "online.py"
    spec = importlib.util.spec_from_file_location(f"_durable_sessions_online_{revision}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


online = _online()


def _ranges(table: str) -> list[tuple[int, int]]:
    out = []
    for part in table.split():
        first, _, last = part.partition("-")
        out.append((int(first, 16), int(last or first, 16)))
    return out


def _pg_char(code: int) -> str:
    """A code point as a Postgres regular expression escape (ASCII SQL in any encoding)."""
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _pg_class() -> str:
    return "".join(
        _pg_char(a) if a == b else f"{_pg_char(a)}-{_pg_char(b)}" for a, b in _ranges(WORD_RANGES)
    )


def _e(text: str) -> str:
    """``text`` as a Postgres E'' literal (backslashes and quotes doubled)."""
    return "E" + Q + text.replace("\\", "\\\\").replace(Q, Q + Q) + Q


def _schema_prefix() -> str:
    """The current schema, quoted, with a dot: functions an index calls run with the
    search_path of whoever builds it (a restore runs with an empty one), so the inner calls
    name their schema."""
    if op.get_context().as_sql:
        schema = "public"
    else:
        schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar()
    return '"' + str(schema).replace('"', '""') + '".'


def function_statements(s: str) -> list[str]:
    """The ``CREATE FUNCTION`` statements of this revision's functions, in schema ``s``
    (quoted, with a dot). Revision 0006 replaces some and restores them on downgrade."""
    word = _pg_class()
    out: list[str] = []
    # translate() takes characters, not escapes: E'' literals with \u escapes.
    fold_from = "E" + Q + "".join(f"\\u{ord(c):04x}" for c in FOLD_FROM) + Q
    fold_to = "E" + Q + "".join(f"\\u{ord(c):04x}" for c in FOLD_TO) + Q
    # The string values of a content at any depth, as jsonb prints an array of them, with
    # each escape and each '", "' between strings made one space: after the leading '["'
    # the text is the strings joined by spaces, character for character.
    strings = "'strict $.** ? (@.type() == \"string\")'"
    out.append(
        f"""CREATE FUNCTION {s}ds_search_text(content jsonb) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT left(regexp_replace(jsonb_path_query_array(content, {strings})::text,
            {_e(ESCAPES)}, ' ', 'g'), {MAX_TEXT + 2})
        $$"""
    )
    # Its words: case folded (lower, then the foldings lower leaves), runs of more than
    # MAX_WORD word characters dropped, split on everything else.
    out.append(
        f"""CREATE FUNCTION {s}ds_search_words(text text) RETURNS text[]
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT array_remove(regexp_split_to_array(regexp_replace(
            translate(lower(text), {fold_from}, {fold_to}),
            {_e(f"[{word}]{{{MAX_WORD}}}[{word}]+")}, ' ', 'g'),
            {_e(f"[^{word}]+")}), '')
        $$"""
    )
    # The tsvector of a content's words, at their positions, so that a search counts each
    # word's occurrences from it. Positions stop at 16,383 and 256 per word: past either,
    # the vector has no positions, and a search counts from the content instead.
    out.append(
        f"""CREATE FUNCTION {s}ds_search_vector(content jsonb) RETURNS tsvector
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            words text[] := {s}ds_search_words({s}ds_search_text(content));
            found tsvector;
        BEGIN
            IF cardinality(words) BETWEEN 1 AND 16382 THEN
                found := CAST(array_to_string(ARRAY(
                    SELECT {Q * 4} || w || {Q * 3}:{Q} || n
                    FROM unnest(words) WITH ORDINALITY AS u(w, n)), ' ') AS tsvector);
                IF NOT EXISTS (
                    SELECT FROM unnest(found) AS u WHERE cardinality(u.positions) >= 256
                ) THEN
                    RETURN found;
                END IF;
            END IF;
            RETURN array_to_tsvector(words);
        END
        $$"""
    )
    # A search text as a tsquery of all its words, each quoted (a word holds only word
    # characters: never a quote or an operator), so the text is data, never syntax.
    # NULL (matching nothing) when it has no word.
    out.append(
        f"""CREATE FUNCTION {s}ds_search_query(text text) RETURNS tsquery
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT CASE WHEN cardinality({s}ds_search_words(text)) > 0 THEN CAST(
            {Q * 4} || array_to_string({s}ds_search_words(text), {Q * 3} & {Q * 3})
            || {Q * 4} AS tsquery) END
        $$"""
    )
    return out


def trigger_statements(s: str, content: str) -> list[str]:
    """The trigger function (computing the vector of ``content``) and the statement that
    creates the trigger unless it exists (a ``DO`` block: no ``IF NOT EXISTS`` before
    Postgres 14)."""
    function = f"""CREATE OR REPLACE FUNCTION {s}{TRIGGER}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.search_vector := {s}ds_search_vector({content});
            RETURN NEW;
        END
        $$"""
    trigger = f"""DO $do$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = to_regclass('ds_events')
                AND tgname = '{TRIGGER}') THEN
            CREATE TRIGGER {TRIGGER} BEFORE INSERT ON ds_events FOR EACH ROW
                WHEN (NEW.search_vector IS NULL) EXECUTE FUNCTION {s}{TRIGGER}();
        END IF;
    END $do$"""
    return [function, trigger]


def _upgrade_postgres() -> None:
    s = _schema_prefix()
    for statement in function_statements(s):
        op.execute(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    # Stored, so that neither a search's filter nor a recheck computes it again. Added
    # empty (no rewrite); from the trigger on, every insert brings or gets its vector.
    online.ddl("ALTER TABLE ds_events ADD COLUMN IF NOT EXISTS search_vector tsvector")
    function, trigger = trigger_statements(s, "NEW.content::jsonb")
    op.execute(function)
    online.ddl(trigger, "create the trigger ds_events_search_vector")
    online.backfill(
        "0003 search vectors",
        f"UPDATE ds_events AS e SET search_vector = {s}ds_search_vector(e.content) "
        "WHERE {range} AND e.search_vector IS NULL AND e.content IS NOT NULL",
    )
    online.create_index("ix_ds_events_search", "ON ds_events USING gin (search_vector)")


def _sqlite_text(content: str) -> str:
    return (
        f"substr((SELECT group_concat(value, ' ') FROM json_tree({content}) "
        f"WHERE type = 'text'), 1, {MAX_TEXT})"
    )


def _upgrade_sqlite() -> None:
    separators = "".join(chr(c) for a, b in _ranges(SQLITE_SEPARATORS) for c in range(a, b + 1))
    tokenize = (
        "unicode61 remove_diacritics 0 categories 'L* N* M* Co' "
        f"separators '{separators.replace(Q, Q + Q)}'"
    )
    key = "org_id = {0}.org_id AND session_id = {0}.session_id AND seq = {0}.seq"
    # One short write transaction (Alembic's, which env.py begins IMMEDIATE) for the
    # tables and triggers; from then on every write of an event keeps the index in step.
    op.execute(
        "CREATE TABLE IF NOT EXISTS ds_events_fts_rowid (rid INTEGER PRIMARY KEY, "
        "org_id VARCHAR(255) NOT NULL, session_id VARCHAR(255) NOT NULL, seq BIGINT NOT NULL, "
        "UNIQUE (org_id, session_id, seq))"
    )
    op.execute(
        "CREATE VIEW IF NOT EXISTS ds_events_fts_text (rid, body) AS SELECT k.rid, "
        f"{_sqlite_text('e.content')} "
        "FROM ds_events_fts_rowid AS k JOIN ds_events AS e ON e.org_id = k.org_id "
        "AND e.session_id = k.session_id AND e.seq = k.seq"
    )
    op.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS ds_events_fts USING fts5(body, "
        f"content='ds_events_fts_text', content_rowid='rid', "
        f"tokenize='{tokenize.replace(Q, Q + Q)}')"
    )
    insert = (
        "INSERT INTO ds_events_fts_rowid (org_id, session_id, seq) "
        "VALUES (new.org_id, new.session_id, new.seq); "
        "INSERT INTO ds_events_fts (rowid, body) VALUES (last_insert_rowid(), "
        f"{_sqlite_text('new.content')}); "
    )
    remove = (
        "INSERT INTO ds_events_fts (ds_events_fts, rowid, body) SELECT 'delete', rid, "
        f"{_sqlite_text('old.content')} FROM ds_events_fts_rowid WHERE {key.format('old')}; "
        f"DELETE FROM ds_events_fts_rowid WHERE {key.format('old')}; "
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_events_fts_insert AFTER INSERT ON ds_events "
        f"BEGIN {insert}END"
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_events_fts_delete AFTER DELETE ON ds_events "
        f"BEGIN {remove}END"
    )
    op.execute(
        "CREATE TRIGGER IF NOT EXISTS ds_events_fts_update AFTER UPDATE OF org_id, session_id, "
        f"seq, content ON ds_events BEGIN {remove}{insert}END"
    )
    # The events already stored, a batch per write transaction: the events of the batch
    # without a key get one (consecutive rids, past the largest), then their text.
    online.backfill(
        "0003 full-text index",
        [
            "SELECT coalesce(max(rid), 0) AS before_rid FROM ds_events_fts_rowid",
            "INSERT INTO ds_events_fts_rowid (org_id, session_id, seq) "
            "SELECT e.org_id, e.session_id, e.seq FROM ds_events AS e WHERE {range} "
            "AND NOT EXISTS (SELECT 1 FROM ds_events_fts_rowid AS k WHERE k.org_id = e.org_id "
            "AND k.session_id = e.session_id AND k.seq = e.seq) "
            "ORDER BY e.org_id, e.session_id, e.seq",
            "INSERT INTO ds_events_fts (rowid, body) "
            "SELECT rid, body FROM ds_events_fts_text WHERE rid > :before_rid",
        ],
        offline_statements=[
            "INSERT INTO ds_events_fts_rowid (org_id, session_id, seq) "
            "SELECT org_id, session_id, seq FROM ds_events ORDER BY org_id, session_id, seq",
            "INSERT INTO ds_events_fts (rowid, body) SELECT rid, body FROM ds_events_fts_text",
        ],
    )


MYSQL_WORDS = "ds_event_words"
"""MySQL's full-text index: one row per distinct word of an event (InnoDB's FULLTEXT drops
words under three letters and its stop words, and splits words by rules of its own)."""


def _upgrade_mysql() -> None:
    """The words table, filled by the store as it writes events (the word rules are
    ``durable_sessions.fulltext``'s, applied in Python); it goes with its event."""
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {MYSQL_WORDS} ("
        "org_id VARBINARY(512) NOT NULL, "
        "word VARBINARY(1020) NOT NULL, "
        "session_id VARBINARY(512) NOT NULL, "
        "seq BIGINT NOT NULL, "
        "n INTEGER NOT NULL, "
        "PRIMARY KEY (org_id, word, session_id, seq), "
        f"CONSTRAINT fk_{MYSQL_WORDS}_ds_events FOREIGN KEY (org_id, session_id, seq) "
        "REFERENCES ds_events (org_id, session_id, seq) ON DELETE CASCADE"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
    )


def upgrade() -> None:
    """Add the full-text index of event contents and index the events already stored."""
    name = op.get_context().dialect.name
    if name == "postgresql":
        _upgrade_postgres()
    elif name in ("mysql", "mariadb"):
        _upgrade_mysql()
    else:
        _upgrade_sqlite()


def downgrade() -> None:
    """Drop the full-text index and what maintains it."""
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.execute(f"DROP TABLE IF EXISTS {MYSQL_WORDS}")
        return
    if op.get_context().dialect.name == "postgresql":
        s = _schema_prefix()
        op.execute("DROP INDEX IF EXISTS ix_ds_events_search")
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON ds_events")
        op.execute(f"DROP FUNCTION IF EXISTS {s}{TRIGGER}()")
        op.execute("ALTER TABLE ds_events DROP COLUMN search_vector")
        for name in PG_FUNCTIONS:
            op.execute(f"DROP FUNCTION {name}")
        return
    for name in SQLITE_TRIGGERS:
        op.execute(f"DROP TRIGGER {name}")
    op.execute("DROP TABLE ds_events_fts")
    op.execute("DROP VIEW ds_events_fts_text")
    op.execute("DROP TABLE ds_events_fts_rowid")
