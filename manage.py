#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "convoyweb.settings")
    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError, ProgrammingError

    try:
        execute_from_command_line(sys.argv)
    except (OperationalError, ProgrammingError) as exc:
        said = str(exc)
        if "no such table" not in said and not ('relation "' in said and "does not exist" in said):
            raise
        # A database nobody migrated: most often not the one the server uses.
        from django.db import connection

        name = connection.settings_dict.get("NAME")
        sys.exit(
            f"error: {name} has no convoyweb tables ({said.splitlines()[0]}): run "
            "`manage.py migrate`, or set DATABASE_URL to the database the server uses"
        )
    except BrokenPipeError:
        # The reader went away (`… | head`): stop quietly, as other commands do, and keep
        # Python from failing again on flushing the closed stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
