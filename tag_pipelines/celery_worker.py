"""What a Celery worker loads (`celery -A tag_pipelines.celery_worker worker`): the app, with cluster mode's
settings, and its one task, Dagster's step runner."""

from dagster_celery.tasks import create_task

from .celery_config import make_worker_app

app = make_worker_app()
execute_plan = create_task(app)
