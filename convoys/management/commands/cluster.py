"""`manage.py cluster`: the django-q2 task cluster plus the ticker thread that drives the
catch-up feeder (every CONVOY_FEED_INTERVAL s) and the stranded scan (CONVOY_STRANDED_INTERVAL).

SIGTERM or Ctrl-C to this process stops the ticker, lets in-flight tasks finish and exits.
"""

import os
import socket
import threading
import time

from django.core.management.base import BaseCommand
from django_q.cluster import Cluster

from ...services import ticker


class Command(BaseCommand):
    help = "Run the django-q2 task cluster with the convoy ticker (feeder and stranded scan)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-ticker",
            action="store_true",
            help="run only the task cluster (another process ticks)",
        )

    def handle(self, *args, no_ticker=False, **options):
        cluster = Cluster()
        cluster.start()
        stop = threading.Event()
        if not no_ticker:
            holder = f"{socket.gethostname()}:{os.getpid()}"
            thread = threading.Thread(
                target=ticker.run, args=(stop, holder), name="ticker", daemon=True
            )
            thread.start()
            self.stdout.write(self.style.SUCCESS("ticker started"))
        try:
            while cluster.sentinel is not None and cluster.sentinel.is_alive():
                time.sleep(0.2)
        finally:
            stop.set()
